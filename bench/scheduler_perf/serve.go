package schedulerperf

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/kubernetes/test/utils/client-go/ktesting"
)

// serveConfig is how each workload's phalanx serve is started.
type serveConfig struct {
	bin       string
	extraArgs []string
	logDir    string
	httpAddr  string
	grpcAddr  string
}

// usage is what a workload's phalanx serve cost, written beside its log as <workload>.usage.json.
type usage struct {
	Workload   string  `json:"workload"`
	CPUSeconds float64 `json:"cpu_seconds"`
	MaxRSSMiB  float64 `json:"max_rss_mib"`
	ReadySecs  float64 `json:"ready_seconds"`
}

// start is the benchmark's prepare hook: the API server and the scheduler are up, no node or pod
// exists yet. It writes a kubeconfig for the benchmark's API server, starts phalanx serve on it,
// waits until /readyz answers 200 and stops phalanx serve when the workload ends.
func (s serveConfig) start(tCtx ktesting.TContext) error {
	name := strings.ReplaceAll(tCtx.Name(), "/", "_")
	kubeconfig := filepath.Join(s.logDir, name+".kubeconfig")
	if err := writeKubeconfig(tCtx.RESTConfig(), kubeconfig); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(s.logDir, name+".serve.log"))
	if err != nil {
		return err
	}
	// loopback without a token: the harness polls /readyz on the extender's port
	args := append([]string{"serve", "--kubeconfig", kubeconfig, "--http-addr", s.httpAddr,
		"--grpc-addr", s.grpcAddr, "--insecure-loopback-no-auth"}, s.extraArgs...)
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// its own process group (stopped with its children), and stopped if this process dies first
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	rec := usage{Workload: tCtx.Name()}
	tCtx.Cleanup(func() {
		rec.CPUSeconds, rec.MaxRSSMiB = processUsage(cmd.Process.Pid)
		saveMetrics("http://"+s.httpAddr+"/metrics", filepath.Join(s.logDir, name+".metrics.txt"))
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		_ = logFile.Close()
		if data, err := json.Marshal(rec); err == nil {
			_ = os.WriteFile(filepath.Join(s.logDir, name+".usage.json"), data, 0o644)
		}
	})
	deadline := time.Now().Add(180 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("phalanx serve exited before it was ready (%v); see %s; it ends: %s", err, logFile.Name(),
				logTail(logFile.Name()))
		default:
		}
		resp, err := http.Get("http://" + s.httpAddr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				rec.ReadySecs = time.Since(began).Seconds()
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("phalanx serve not ready after 180s; see %s; it ends: %s", logFile.Name(), logTail(logFile.Name()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logTail is the last lines of a log file on one line (what a failure names, so that it can be read
// where the log is not kept).
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// saveMetrics keeps what phalanx serve's /metrics answers at the end of a workload (its plan
// requests, API writes, plan transitions) beside its log; nothing when it does not answer.
func saveMetrics(url, path string) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return
	}
	defer func() { _ = resp.Body.Close() }()
	if data, err := io.ReadAll(resp.Body); err == nil && resp.StatusCode == http.StatusOK {
		_ = os.WriteFile(path, data, 0o644)
	}
}

// writeKubeconfig writes cfg (the benchmark's client configuration) as a kubeconfig file.
func writeKubeconfig(cfg *restclient.Config, path string) error {
	if cfg == nil {
		return fmt.Errorf("the benchmark has no REST configuration")
	}
	cluster := &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData,
		CertificateAuthority: cfg.CAFile, InsecureSkipTLSVerify: cfg.Insecure, TLSServerName: cfg.ServerName}
	user := &clientcmdapi.AuthInfo{Token: cfg.BearerToken, TokenFile: cfg.BearerTokenFile,
		ClientCertificateData: cfg.CertData, ClientCertificate: cfg.CertFile,
		ClientKeyData: cfg.KeyData, ClientKey: cfg.KeyFile, Username: cfg.Username, Password: cfg.Password}
	config := clientcmdapi.NewConfig()
	config.Clusters["benchmark"] = cluster
	config.AuthInfos["benchmark"] = user
	config.Contexts["benchmark"] = &clientcmdapi.Context{Cluster: "benchmark", AuthInfo: "benchmark"}
	config.CurrentContext = "benchmark"
	return clientcmd.WriteToFile(*config, path)
}

// processUsage is the CPU seconds (user + system, children included) and peak RSS of pid and its
// process group's children, read from /proc (0 when unreadable).
func processUsage(pid int) (cpu float64, maxRSSMiB float64) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		// fields after the command name (which may hold spaces) start at the last ')'
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// utime, stime, cutime, cstime are fields 14-17 of stat, 12-15 after the name
		ticks := 0.0
		for _, f := range fields[11:15] {
			v, _ := strconv.ParseFloat(f, 64)
			ticks += v
		}
		cpu = ticks / 100.0 // USER_HZ
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, "VmHWM:") {
				kb, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
				maxRSSMiB = kb / 1024
			}
		}
	}
	return cpu, maxRSSMiB
}
