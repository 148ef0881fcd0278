// The plugin itself, and what every phase shares. kube-scheduler calls New once per profile that
// enables Phalanx, while it builds its frameworks and before any scheduling cycle; New connects to
// phalanx serve and starts the reservations stream (stream.go). Shared by the phases: a pod's group
// (GroupOf), the cycle state PreFilter leaves for the later phases of the same cycle (podState),
// and the one way an RPC is made (unary: under the breaker, with a deadline).

package phalanx

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// Name is the plugin's name in KubeSchedulerConfiguration profiles.
const Name = "Phalanx"

// LabelPodGroup names a pod's PodGroup in phalanx's CRD flavor (cluster/names.py
// LABEL_POD_GROUP); the built-in flavor uses spec.schedulingGroup.podGroupName.
const LabelPodGroup = "scheduling.phalanx.dev/pod-group"

// AnnotationRetry is the annotation phalanx serve writes to touch a pending member (cluster/names.py
// ANNOTATION_RETRY): its group may go on now, retry it.
const AnnotationRetry = "scheduling.phalanx.dev/retry"

const stateKey fwk.StateKey = Name

const version = pb.ContractVersion_CONTRACT_VERSION_1

// Handle is the part of the framework handle the plugin uses (fwk.Handle satisfies it).
type Handle interface {
	GetWaitingPod(uid types.UID) fwk.WaitingPod
	RejectWaitingPod(uid types.UID) bool
	Activate(logger klog.Logger, pods map[string]*v1.Pod)
}

// Plugin implements the extension points listed in the package documentation.
type Plugin struct {
	args    Args
	handle  Handle
	pods    corelisters.PodLister // nil: no activation of waiting groups (tests)
	client  pb.SchedulerPluginClient
	breaker *Breaker
	mirror  *Mirror
	logger  klog.Logger
	ctx     context.Context // the plugin's lifetime: calls made beside the scheduling loop
	closeFn func()
	wg      sync.WaitGroup

	// groups with members turned away because serve did not answer, to be retried (retryLater)
	retryMu    sync.Mutex
	retrying   map[string]bool
	retryAfter time.Duration

	mu       sync.Mutex
	planning map[string]*planCall // group -> its PlanForPod call in flight
	// one PlanForPod call at a time: concurrent solves of different groups slow each other on the
	// service's cores and each plan committed makes the others start over
	calling chan struct{}
	// members waiting in PreBind (the barrier of members naming a ResourceClaim): each gate gets
	// one decision, sent under mu by whoever removes it from the map
	atPreBind map[types.UID]chan decision
	// members at Permit waiting for their group's next Permit call, while one is in flight (a
	// gang's members reach Permit together: one call names many reserved, not one call each)
	permitting map[string][]permitting
	// whether the profile runs this plugin at PreBind after DynamicResources (read once, from the
	// built framework): only then do members naming a claim pass Permit
	preBindOnce sync.Once
	preBind     bool
	// kube-scheduler runs its pod-group cycle (GenericWorkload), which writes each group's
	// PodGroupInitiallyScheduled condition: Permit tells the service so it does not write it too
	conditionByScheduler bool
}

var (
	_ fwk.PreEnqueuePlugin  = &Plugin{}
	_ fwk.PreFilterPlugin   = &Plugin{}
	_ fwk.FilterPlugin      = &Plugin{}
	_ fwk.PostFilterPlugin  = &Plugin{}
	_ fwk.PreScorePlugin    = &Plugin{}
	_ fwk.ScorePlugin       = &Plugin{}
	_ fwk.ReservePlugin     = &Plugin{}
	_ fwk.PermitPlugin      = &Plugin{}
	_ fwk.PreBindPlugin     = &Plugin{}
	_ fwk.EnqueueExtensions = &Plugin{}
	_ fwk.SignPlugin        = &Plugin{}
)

// reconnect is how soon the plugin's connection to serve is dialled again after a failed attempt:
// from 100 ms, growing to at most maxStreamBackoff (gRPC's default grows to 120 s, 1 s at first: a
// scheduler that started a few seconds before its serve then waited seconds more for a serve that
// was up). A dial to serve is cheap: on loopback beside it, or one TLS handshake to its Service.
var reconnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxStreamBackoff},
	MinConnectTimeout: 5 * time.Second,
})

// New is the plugin factory registered with app.WithPlugin.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	transport := insecure.NewCredentials()
	if args.TLS != nil {
		if transport, err = transportCredentials(*args.TLS, klog.FromContext(ctx)); err != nil {
			return nil, err
		}
	}
	conn, err := grpc.NewClient(args.Address, grpc.WithTransportCredentials(transport), reconnect)
	if err != nil {
		return nil, fmt.Errorf("phalanx plugin: gRPC client for %s: %w", args.Address, err)
	}
	var pods corelisters.PodLister
	if f := h.SharedInformerFactory(); f != nil {
		pods = f.Core().V1().Pods().Lister()
	}
	p := NewWithClient(ctx, args, h, pods, pb.NewSchedulerPluginClient(conn))
	p.closeFn = func() { _ = conn.Close() }
	p.conditionByScheduler = utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload)
	return p, nil
}

// NewWithClient builds the plugin on an existing client and starts the reservations stream
// (until ctx ends).
func NewWithClient(ctx context.Context, args Args, h Handle, pods corelisters.PodLister,
	client pb.SchedulerPluginClient) *Plugin {
	p := &Plugin{args: args, handle: h, pods: pods, client: client, mirror: NewMirror(),
		breaker: NewBreaker(args.BreakerFailures, args.BreakerCooldown.Duration), logger: klog.FromContext(ctx),
		ctx: ctx, retrying: map[string]bool{}, retryAfter: args.BreakerCooldown.Duration, planning: map[string]*planCall{}, calling: make(chan struct{}, 1),
		atPreBind: map[types.UID]chan decision{}, permitting: map[string][]permitting{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.watch(ctx)
	}()
	return p
}

// Close stops using the connection when kube-scheduler shuts the framework down (the stream ends
// with the factory's context).
func (p *Plugin) Close() error {
	if p.closeFn != nil {
		p.closeFn()
	}
	return nil
}

// Name implements fwk.Plugin.
func (p *Plugin) Name() string { return Name }

// Mirror is the local copy of the service's plans and reservations.
func (p *Plugin) Mirror() *Mirror { return p.mirror }

// GroupOf is "namespace/name" of the pod's PodGroup, "" when it names none. Every phase asks it
// first: a pod without a group is a plain pod.
func GroupOf(pod *v1.Pod) string {
	name := ""
	if g := pod.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil {
		name = *g.PodGroupName
	}
	if name == "" {
		name = pod.Labels[LabelPodGroup]
	}
	if name == "" {
		return ""
	}
	ns := pod.Namespace
	if ns == "" {
		ns = "default"
	}
	return ns + "/" + name
}

// podState is what PreFilter learned for the later extension points of the same cycle (Filter,
// PostFilter, PreScore, Score).
type podState struct {
	group    string
	node     string               // a member's planned node
	trades   map[string]types.UID // other nodes offered to the member: node -> the member it trades with
	requests v1.ResourceList      // a plain pod's requests (when some node holds reservations)
}

func (s *podState) Clone() fwk.StateData { return s }

// readState is what PreFilter wrote in this cycle, nil when it wrote nothing (it skipped the pod).
func readState(state fwk.CycleState) *podState {
	if state == nil {
		return nil
	}
	data, err := state.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := data.(*podState)
	return s
}

// unary makes one call under the breaker, with a deadline: the calls of Reserve, Unreserve, Permit,
// PreBind and PostFilter (PreFilter's PlanForPod runs beside the loop, see planFor).
func (p *Plugin) unary(ctx context.Context, timeout time.Duration, call func(context.Context) error) error {
	if err := p.breaker.Allow(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := call(ctx)
	p.breaker.Record(err)
	return err
}

// unreachable is the status a phase answers a member with when the service did not answer: the
// member waits (UnschedulableAndUnresolvable, retried on the next event).
func (p *Plugin) unreachable(group string, err error) *fwk.Status {
	p.retryLater(group)
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
		fmt.Sprintf("phalanx: podgroup %s waits: phalanx serve did not answer: %v", group, err))
}

// retryLater moves the group's pending members back to the active queue once retryAfter has
// passed (one timer per group at a time). kube-scheduler sets a member turned away because phalanx
// serve did not answer aside until a cluster event its plugins registered for, and at rest none
// follows once serve is back: a gang that arrived during an outage stayed pending after it (seen in
// the network-fault run). While serve stays away the members come back every retryAfter and are
// answered at once by the open breaker; the first of them after it heals is its trial call.
func (p *Plugin) retryLater(group string) {
	p.retryMu.Lock()
	if p.retrying[group] {
		p.retryMu.Unlock()
		return
	}
	p.retrying[group] = true
	p.retryMu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		timer := time.NewTimer(p.retryAfter)
		defer timer.Stop()
		select {
		case <-p.ctx.Done():
		case <-timer.C:
		}
		p.retryMu.Lock()
		delete(p.retrying, group)
		p.retryMu.Unlock()
		if p.ctx.Err() == nil {
			p.activate([]string{group}, nil)
		}
	}()
}

// Wait blocks until the plugin's goroutines ended (the stream's context must be done). Tests.
func (p *Plugin) Wait() { p.wg.Wait() }
