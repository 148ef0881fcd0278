// Package schedulerperf runs upstream's scheduler_perf workloads (k8s.io/kubernetes v1.37.2,
// test/integration/scheduler_perf/podgroup/<topic>/performance-config.yaml, read as published)
// with one of three schedulers:
//
//   - in-tree: upstream's own gang scheduling, the test case's own scheduler configuration;
//   - plugin: phalanx's framework plugin in the out-of-tree registry, enabled as
//     scheduler-config/kube-scheduler-plugin-config.yaml enables it, talking to `phalanx serve`;
//   - extender: kube-scheduler with phalanx as its HTTP extender, as
//     scheduler-config/kube-scheduler-config.yaml configures it.
//
// In both phalanx modes the in-tree GangScheduling, TopologyPlacementGenerator and
// PodGroupPodsCount plugins are disabled in the profile (phalanx owns the group logic; upstream
// enables them by default whenever GenericWorkload is on, and the benchmark turns that gate on for
// the whole process). `phalanx serve` runs as a process, as deployed, started for each workload
// against the benchmark's own API server once that server is up, and stopped when it ends.
//
// The only change to upstream's file is the test case's schedulerConfigPath (the one way
// scheduler_perf takes a configuration): the workloads, templates and metrics are upstream's.
// `phalanx bench scheduler-perf` builds and runs this and writes the tables.
package schedulerperf

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	_ "k8s.io/component-base/logs/json/register"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"
	"k8s.io/kubernetes/test/utils/client-go/ktesting"

	"phalanx.dev/scheduler-plugin/pkg/phalanx"
)

var (
	schedulerFlag = flag.String("phalanx-scheduler", "in-tree", "in-tree, plugin or extender")
	topicDirFlag  = flag.String("phalanx-topic-dir", "",
		"upstream's topic folder (test/integration/scheduler_perf/podgroup/<topic> of k8s.io/kubernetes v1.37.2)")
	repoFlag      = flag.String("phalanx-repo", "../..", "phalanx's repository (its scheduler-config/ is read)")
	binFlag       = flag.String("phalanx-bin", "phalanx", "the phalanx executable")
	serveArgsFlag = flag.String("phalanx-serve-args", "", "more arguments for phalanx serve, space separated")
	logDirFlag    = flag.String("phalanx-log-dir", "", "where phalanx serve's logs and usage records go (default: a temporary folder)")
	podsTimeout   = flag.Duration("phalanx-pods-timeout", 0,
		"how long a workload waits for its pods to be scheduled before it fails (0: upstream's default)")
)

func TestMain(m *testing.M) {
	if err := perf.InitTests(); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// BenchmarkPerfScheduling runs the topic's workloads that pass -perf-scheduling-label-filter with
// the scheduler -phalanx-scheduler names.
func BenchmarkPerfScheduling(b *testing.B) {
	mode, err := parseMode(*schedulerFlag)
	if err != nil {
		b.Fatal(err)
	}
	if *topicDirFlag == "" {
		b.Fatal("-phalanx-topic-dir is required")
	}
	topicDir, err := filepath.Abs(*topicDirFlag)
	if err != nil {
		b.Fatal(err)
	}
	repo, err := filepath.Abs(*repoFlag)
	if err != nil {
		b.Fatal(err)
	}
	logDir := *logDirFlag
	if logDir == "" {
		logDir = b.TempDir()
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		b.Fatal(err)
	}
	ports, err := freePorts(2)
	if err != nil {
		b.Fatal(err)
	}
	serve := serveConfig{bin: *binFlag, extraArgs: splitArgs(*serveArgsFlag), logDir: logDir,
		httpAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), grpcAddr: fmt.Sprintf("127.0.0.1:%d", ports[1])}

	work := b.TempDir()
	schedulerConfig := ""
	if mode != modeInTree {
		schedulerConfig = filepath.Join(work, "scheduler-config.yaml")
		if err := writeSchedulerConfig(mode, repo, serve, schedulerConfig); err != nil {
			b.Fatal(err)
		}
	}
	config, err := deriveTopic(topicDir, work, schedulerConfig)
	if err != nil {
		b.Fatal(err)
	}
	// upstream's templates are named relative to the working directory
	previous, err := os.Getwd()
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Chdir(work); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = os.Chdir(previous) }()

	var registry frameworkruntime.Registry
	var options []perf.SchedulerPerfOption
	if mode == modePlugin {
		registry = frameworkruntime.Registry{phalanx.Name: phalanx.New}
		perf.PluginNames = append(perf.PluginNames, phalanx.Name)
	}
	options = append(options, perf.WithPrepareFn(func(tCtx ktesting.TContext) error {
		watchEvictions(tCtx, logDir) // every scheduler's victims, counted the same way
		if mode == modeInTree {
			return nil
		}
		return serve.start(tCtx)
	}))
	if *podsTimeout > 0 {
		options = append(options, perf.WithPodsSchedulingTimeout(*podsTimeout))
	}
	perf.RunBenchmarkPerfScheduling(b, config, filepath.Base(topicDir)+"-"+string(mode), registry, options...)
}
