package phalanx

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
)

// Args configure the plugin (pluginConfig[].args of the profile). Zero fields take the defaults.
type Args struct {
	// Address of phalanx serve's gRPC endpoint (host:port). Default 127.0.0.1:50051.
	Address string `json:"address,omitempty"`
	// Deadline of Reserve, Permit, Unreserve and ReportRejection calls. Default 2s.
	RPCTimeout metav1.Duration `json:"rpcTimeout,omitempty"`
	// Deadline of PlanForPod (it may run a workload cycle). Past it the member is answered
	// "plan pending" and retried when the plan appears on the reservations stream. Default 5s.
	PlanTimeout metav1.Duration `json:"planTimeout,omitempty"`
	// How long PreFilter waits for a PlanForPod reply before it answers the member "being
	// planned" (the scheduling loop goes on; the group's members are moved back to the active
	// queue when the reply lands). Quick answers (a plan already held, "waiting for members")
	// come inside it; a solve usually does not. Default 100ms.
	PlanWait metav1.Duration `json:"planWait,omitempty"`
	// Longest a gang member waits at Permit for the rest of its gang; then the whole gang is
	// rejected (phalanx serve's --barrier-timeout, 30s by default, should match). Default 30s.
	PermitTimeout metav1.Duration `json:"permitTimeout,omitempty"`
	// Consecutive transport failures that open the circuit breaker. Default 3.
	BreakerFailures int `json:"breakerFailures,omitempty"`
	// How long an open breaker refuses calls before one trial. Default 5s.
	BreakerCooldown metav1.Duration `json:"breakerCooldown,omitempty"`
	// mTLS to phalanx serve (its --grpc-tls-cert and --grpc-client-ca). Absent: plaintext, for
	// serve on the same loopback.
	TLS *TLSArgs `json:"tls,omitempty"`
}

// Defaulted returns a copy with every zero field set to its default, or an error for a bad value.
func (a Args) Defaulted() (Args, error) {
	def := func(d *metav1.Duration, v time.Duration) {
		if d.Duration == 0 {
			d.Duration = v
		}
	}
	if a.Address == "" {
		a.Address = "127.0.0.1:50051"
	}
	def(&a.RPCTimeout, 2*time.Second)
	def(&a.PlanTimeout, 5*time.Second)
	def(&a.PlanWait, 100*time.Millisecond)
	def(&a.PermitTimeout, 30*time.Second)
	def(&a.BreakerCooldown, 5*time.Second)
	if a.BreakerFailures == 0 {
		a.BreakerFailures = 3
	}
	for name, d := range map[string]time.Duration{"rpcTimeout": a.RPCTimeout.Duration,
		"planTimeout": a.PlanTimeout.Duration, "planWait": a.PlanWait.Duration, "permitTimeout": a.PermitTimeout.Duration,
		"breakerCooldown": a.BreakerCooldown.Duration} {
		if d < 0 {
			return a, fmt.Errorf("phalanx plugin args: %s must not be negative, got %s", name, d)
		}
	}
	if a.BreakerFailures < 0 {
		return a, fmt.Errorf("phalanx plugin args: breakerFailures must not be negative, got %d", a.BreakerFailures)
	}
	return a, a.TLS.validate()
}

// DecodeArgs reads the profile's args (nil: all defaults).
func DecodeArgs(obj runtime.Object) (Args, error) {
	var args Args
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &args); err != nil {
			return args, fmt.Errorf("phalanx plugin args: %w", err)
		}
	}
	return args.Defaulted()
}
