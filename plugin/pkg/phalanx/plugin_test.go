package phalanx

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// fakeService is a phalanx serve double: it answers what the test programs and counts calls.
type fakeService struct {
	pb.UnimplementedSchedulerPluginServer
	mu        sync.Mutex
	calls     map[string]int
	plan      *pb.PlanForPodReply
	permit    *pb.PermitReply
	permitReq *pb.PermitRequest
	unreserve *pb.UnreserveReply
	// the reason of every Unreserve call, in order
	unreserveReasons []string
	rejection        *pb.ReportRejectionRequest
	reserveReq       *pb.ReserveRequest
	snapshots        chan *pb.Reservations
	lastPod          map[string]any
	planGate         chan struct{} // when set, PlanForPod answers once it is closed (a solve)
	// when set, Permit answers once it is closed; every request is kept in permitReqs
	permitGate chan struct{}
	permitReqs []*pb.PermitRequest
}

func newFakeService() *fakeService {
	return &fakeService{calls: map[string]int{}, snapshots: make(chan *pb.Reservations, 8)}
}

func (f *fakeService) count(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
}

func (f *fakeService) Calls(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *fakeService) PlanForPod(_ context.Context, r *pb.PlanForPodRequest) (*pb.PlanForPodReply, error) {
	f.count("PlanForPod")
	if f.planGate != nil {
		<-f.planGate
	}
	var pod map[string]any
	_ = json.Unmarshal(r.GetPodJson(), &pod)
	f.mu.Lock()
	f.lastPod = pod
	f.mu.Unlock()
	return f.plan, nil
}

func (f *fakeService) ReportRejection(_ context.Context, r *pb.ReportRejectionRequest) (*pb.ReportRejectionReply, error) {
	f.count("ReportRejection")
	f.mu.Lock()
	f.rejection = r
	f.mu.Unlock()
	return &pb.ReportRejectionReply{Outcome: "released"}, nil
}

func (f *fakeService) Reserve(_ context.Context, r *pb.ReserveRequest) (*pb.ReserveReply, error) {
	f.count("Reserve")
	f.mu.Lock()
	f.reserveReq = r
	f.mu.Unlock()
	return &pb.ReserveReply{Ok: true}, nil
}

func (f *fakeService) Unreserve(_ context.Context, r *pb.UnreserveRequest) (*pb.UnreserveReply, error) {
	f.count("Unreserve")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unreserveReasons = append(f.unreserveReasons, r.GetReason())
	return f.unreserve, nil
}

func (f *fakeService) UnreserveReasons() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.unreserveReasons...)
}

func (f *fakeService) Permit(_ context.Context, r *pb.PermitRequest) (*pb.PermitReply, error) {
	f.count("Permit")
	f.mu.Lock()
	gate := f.permitGate
	f.permitReqs = append(f.permitReqs, r)
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.permitReq = r
	return f.permit, nil
}

func (f *fakeService) WatchReservations(_ *pb.WatchReservationsRequest, s grpc.ServerStreamingServer[pb.Reservations]) error {
	for {
		select {
		case <-s.Context().Done():
			return nil
		case snap := <-f.snapshots:
			if err := s.Send(snap); err != nil {
				return err
			}
		}
	}
}

// fakeHandle is the part of the framework handle the plugin uses: waiting pods and activation.
type fakeHandle struct {
	preBind   []string // the profile's PreBind plugins, in order (ListPlugins)
	mu        sync.Mutex
	waiting   map[types.UID]*fakeWaitingPod
	rejected  []types.UID
	activated []string
}

type fakeWaitingPod struct {
	mu       sync.Mutex
	pod      *v1.Pod
	allowed  []string
	rejected string
}

func (w *fakeWaitingPod) GetPod() *v1.Pod { return w.pod }

func (w *fakeWaitingPod) GetPendingPlugins() []string { return []string{Name} }

func (w *fakeWaitingPod) Allow(plugin string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.allowed = append(w.allowed, plugin)
}

func (w *fakeWaitingPod) Allowed() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.allowed...)
}

func (w *fakeWaitingPod) Reject(_ string, msg string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rejected = msg
	return true
}

func (w *fakeWaitingPod) Preempt(string, string) bool { return true }

func (h *fakeHandle) GetWaitingPod(uid types.UID) fwk.WaitingPod {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w, ok := h.waiting[uid]; ok {
		return w
	}
	return nil
}

func (h *fakeHandle) wait(pod *v1.Pod) *fakeWaitingPod {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := &fakeWaitingPod{pod: pod}
	h.waiting[pod.UID] = w
	return w
}

func (h *fakeHandle) Activated() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.activated...)
}

func (h *fakeHandle) ListPlugins() *config.Plugins {
	var enabled []config.Plugin
	for _, name := range h.preBind {
		enabled = append(enabled, config.Plugin{Name: name})
	}
	return &config.Plugins{PreBind: config.PluginSet{Enabled: enabled}}
}

func (h *fakeHandle) RejectWaitingPod(uid types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rejected = append(h.rejected, uid)
	return true
}

func (h *fakeHandle) Activate(_ klog.Logger, pods map[string]*v1.Pod) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range pods {
		h.activated = append(h.activated, k)
	}
}

type rig struct {
	svc      *fakeService
	handle   *fakeHandle
	plugin   *Plugin
	cancel   context.CancelFunc
	server   *grpc.Server
	listener *bufconn.Listener // what server serves on (a rig made without serving starts it later)
}

// shippedPreBind: the PreBind plugins of the shipped profile on kube-scheduler v1.37.2's defaults
var shippedPreBind = []string{"VolumeBinding", "DynamicResources", Name}

// rigPlanWait is the rig's planWait: past planTimeout, so PreFilter takes every reply itself
// unless a test sets a shorter one.
const rigPlanWait = time.Second

// newSolvingRig is a rig (planWait 20ms) for members a and b of group g whose PlanForPod call is held
// until r.svc.planGate is closed, then plans a on n1 and b on n2.
func newSolvingRig(t testing.TB) (r *rig, a, b *v1.Pod) {
	a, b = member("a", "g"), member("b", "g")
	r = newRigWait(t, true, 20*time.Millisecond, a, b)
	r.svc.planGate = make(chan struct{})
	r.svc.plan = &pb.PlanForPodReply{Verdict: pb.PlanForPodReply_PLANNED, Node: "n1", Plan: &pb.GroupPlan{
		Group: "ns/g", Id: 7, State: "planned", Gang: true, Assignments: map[string]string{"uid-a": "n1", "uid-b": "n2"}}}
	return r, a, b
}

func newRig(t testing.TB, serve bool, pods ...*v1.Pod) *rig {
	return newRigWait(t, serve, rigPlanWait, pods...)
}

func newRigWait(t testing.TB, serve bool, planWait time.Duration, pods ...*v1.Pod) *rig {
	t.Helper()
	listener := bufconn.Listen(1 << 20)
	svc := newFakeService()
	server := grpc.NewServer()
	pb.RegisterSchedulerPluginServer(server, svc)
	if serve {
		go func() { _ = server.Serve(listener) }()
	}
	conn, err := grpc.NewClient("passthrough:///phalanx", grpc.WithTransportCredentials(insecure.NewCredentials()), reconnect,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return listener.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	args, _ := Args{RPCTimeout: metav1.Duration{Duration: 200 * time.Millisecond},
		PlanTimeout: metav1.Duration{Duration: 200 * time.Millisecond}, BreakerCooldown: metav1.Duration{Duration: time.Hour},
		PlanWait: metav1.Duration{Duration: planWait}}.Defaulted()
	ctx, cancel := context.WithCancel(context.Background())
	h := &fakeHandle{waiting: map[types.UID]*fakeWaitingPod{}, preBind: shippedPreBind}
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, pod := range pods {
		_ = indexer.Add(pod)
	}
	lister := corelisters.NewPodLister(indexer)
	r := &rig{svc: svc, handle: h, plugin: NewWithClient(ctx, args, h, lister, pb.NewSchedulerPluginClient(conn)),
		cancel: cancel, server: server, listener: listener}
	t.Cleanup(func() {
		cancel()
		server.Stop()
		r.plugin.Wait()
		_ = conn.Close()
	})
	return r
}

func member(name, group string) *v1.Pod {
	p := plain(name)
	p.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: &group}
	return p
}

func plain(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("1"), "nvidia.com/gpu": resource.MustParse("1")}}}}}}
}

func nodeInfo(name string, gpus int64, pods ...*v1.Pod) fwk.NodeInfo {
	ni := framework.NewNodeInfo(pods...)
	ni.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.NodeStatus{Allocatable: v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("8"), v1.ResourcePods: resource.MustParse("110"),
		"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}}})
	return ni
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // a safety net against a hang, not a speed check
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestGroupOfReadsTheBuiltInFieldThenTheCRDLabel(t *testing.T) {
	if g := GroupOf(member("a", "g")); g != "ns/g" {
		t.Fatalf("built-in field: got %q", g)
	}
	p := plain("b")
	p.Labels = map[string]string{LabelPodGroup: "h"}
	if g := GroupOf(p); g != "ns/h" {
		t.Fatalf("CRD label: got %q", g)
	}
	if g := GroupOf(plain("c")); g != "" {
		t.Fatalf("plain pod: got %q", g)
	}
}

func TestArgsDefaultsAndBadValues(t *testing.T) {
	a, err := Args{}.Defaulted()
	if err != nil || a.Address != "127.0.0.1:50051" || a.RPCTimeout.Duration != 2*time.Second || a.BreakerFailures != 3 {
		t.Fatalf("defaults: %+v %v", a, err)
	}
	if _, err := (Args{RPCTimeout: metav1.Duration{Duration: -time.Second}}).Defaulted(); err == nil ||
		!strings.Contains(err.Error(), "rpcTimeout must not be negative") {
		t.Fatalf("negative timeout: %v", err)
	}
}
