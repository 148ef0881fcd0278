// phalanx-scheduler is kube-scheduler v1.37.2 with phalanx's framework plugin registered (the
// standard out-of-tree pattern). Enable the plugin in a KubeSchedulerConfiguration profile (see
// scheduler-config/kube-scheduler-plugin-config.yaml); every kube-scheduler flag works as usual.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"phalanx.dev/scheduler-plugin/pkg/phalanx"
)

func main() {
	command := app.NewSchedulerCommand(app.WithPlugin(phalanx.Name, phalanx.New))
	os.Exit(cli.Run(command))
}
