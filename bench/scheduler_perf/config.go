package schedulerperf

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

type mode string

const (
	modeInTree   mode = "in-tree"
	modePlugin   mode = "plugin"
	modeExtender mode = "extender"
)

func parseMode(s string) (mode, error) {
	switch m := mode(s); m {
	case modeInTree, modePlugin, modeExtender:
		return m, nil
	}
	return "", fmt.Errorf("-phalanx-scheduler: want in-tree, plugin or extender, got %q", s)
}

// inTreeGroupPlugins are the plugins upstream adds to every profile when GenericWorkload and
// TopologyAwareWorkloadScheduling are on (pkg/scheduler/apis/config/v1/default_plugins.go): in
// phalanx's modes phalanx places the groups, so the profile disables them.
var inTreeGroupPlugins = []string{"GangScheduling", "TopologyPlacementGenerator", "PodGroupPodsCount"}

// writeSchedulerConfig writes the KubeSchedulerConfiguration of a phalanx mode: the repository's
// own file for that mode, pointed at this run's phalanx serve, with the in-tree group plugins
// disabled.
func writeSchedulerConfig(m mode, repo string, serve serveConfig, path string) error {
	source := "kube-scheduler-plugin-config.yaml"
	if m == modeExtender {
		source = "kube-scheduler-config.yaml"
	}
	raw, err := os.ReadFile(filepath.Join(repo, "scheduler-config", source))
	if err != nil {
		return err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("%s: %w", source, err)
	}
	profiles, _ := cfg["profiles"].([]any)
	if len(profiles) == 0 {
		profiles = []any{map[string]any{"schedulerName": "default-scheduler"}}
	}
	profile, ok := profiles[0].(map[string]any)
	if !ok {
		return fmt.Errorf("%s: profiles[0] is not an object", source)
	}
	plugins, _ := profile["plugins"].(map[string]any)
	if plugins == nil {
		plugins = map[string]any{}
	}
	var disabled []any
	for _, name := range inTreeGroupPlugins {
		disabled = append(disabled, map[string]any{"name": name})
	}
	plugins["multiPoint"] = map[string]any{"disabled": disabled}
	profile["plugins"] = plugins
	profiles[0] = profile
	cfg["profiles"] = profiles

	switch m {
	case modePlugin:
		found := false
		for _, item := range asList(profile["pluginConfig"]) {
			entry, _ := item.(map[string]any)
			if entry == nil || entry["name"] != "Phalanx" {
				continue
			}
			args, _ := entry["args"].(map[string]any)
			if args == nil {
				args = map[string]any{}
			}
			args["address"] = serve.grpcAddr
			entry["args"] = args
			found = true
		}
		if !found {
			return fmt.Errorf("%s: no pluginConfig for Phalanx", source)
		}
	case modeExtender:
		extenders := asList(cfg["extenders"])
		if len(extenders) != 1 {
			return fmt.Errorf("%s: want one extender, got %d", source, len(extenders))
		}
		ext, _ := extenders[0].(map[string]any)
		if ext == nil {
			return fmt.Errorf("%s: extenders[0] is not an object", source)
		}
		ext["urlPrefix"] = "http://" + serve.httpAddr + "/scheduler"
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// deriveTopic writes upstream's performance-config.yaml into work with each test case's
// schedulerConfigPath set (when schedulerConfig is not empty) and links upstream's templates
// beside it. It returns the derived file's path.
func deriveTopic(topicDir, work, schedulerConfig string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(topicDir, "performance-config.yaml"))
	if err != nil {
		return "", err
	}
	var cases []map[string]any
	if err := yaml.Unmarshal(raw, &cases); err != nil {
		return "", fmt.Errorf("%s: %w", topicDir, err)
	}
	for _, tc := range cases {
		if schedulerConfig == "" {
			continue
		}
		if existing, ok := tc["schedulerConfigPath"]; ok {
			return "", fmt.Errorf("%s: test case %v already names a scheduler configuration (%v)", topicDir, tc["name"], existing)
		}
		tc["schedulerConfigPath"] = schedulerConfig
	}
	out, err := yaml.Marshal(cases)
	if err != nil {
		return "", err
	}
	path := filepath.Join(work, "performance-config.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return "", err
	}
	if err := os.Symlink(filepath.Join(topicDir, "templates"), filepath.Join(work, "templates")); err != nil {
		return "", err
	}
	return path, nil
}

// freePorts is n distinct TCP ports on 127.0.0.1 that were free a moment ago, chosen below the
// kernel's ephemeral range: a port from that range can be taken by an outgoing connection (the
// harness makes many) between this check and phalanx serve's bind; one below it only by a bind.
func freePorts(n int) ([]int, error) {
	low := 32768
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if fields := strings.Fields(string(data)); len(fields) == 2 {
			if v, err := strconv.Atoi(fields[0]); err == nil {
				low = v
			}
		}
	}
	first := 10000
	if low <= 12000 {
		first = 1024
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 10000 {
			return nil, fmt.Errorf("no free port in [%d, %d)", first, low)
		}
		port := first + rand.IntN(low-first)
		if slices.Contains(ports, port) {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		_ = l.Close()
		ports = append(ports, port)
	}
	return ports, nil
}

func splitArgs(s string) []string { return strings.Fields(s) }
