package phalanx

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

func TestPlainPodsSkipThePluginUntilCapacityIsReservedThenKeepOffIt(t *testing.T) {
	r := newRig(t, true)
	state := framework.NewCycleState()
	if _, st := r.plugin.PreFilter(context.Background(), state, plain("p"), nil); st.Code() != fwk.Skip {
		t.Fatalf("nothing reserved: want Skip, got %v", st)
	}
	if _, st := r.plugin.SignPod(context.Background(), plain("p")); !st.IsSuccess() {
		t.Fatalf("plain pods are batched while nothing is reserved: %v", st)
	}
	if _, st := r.plugin.SignPod(context.Background(), member("a", "g")); st.Code() != fwk.Unschedulable {
		t.Fatalf("members are never batched: %v", st)
	}
	r.svc.snapshots <- &pb.Reservations{Version: 1, Nodes: map[string]*pb.NodeReservation{
		"full": {Amounts: map[string]int64{"nvidia.com/gpu": 4, "cpu": 4000, "pods": 4}}}}
	waitFor(t, "the snapshot", r.plugin.Mirror().HasReservations)
	state = framework.NewCycleState()
	if _, st := r.plugin.PreFilter(context.Background(), state, plain("p"), nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	if st := r.plugin.Filter(context.Background(), state, plain("p"), nodeInfo("full", 4)); st.Code() != fwk.Unschedulable ||
		!strings.Contains(st.Message(), "nvidia.com/gpu on this node is reserved") {
		t.Fatalf("reserved node: %v", st)
	}
	if st := r.plugin.Filter(context.Background(), state, plain("p"), nodeInfo("free", 4)); !st.IsSuccess() {
		t.Fatalf("free node: %v", st)
	}
	if st := r.plugin.Filter(context.Background(), state, plain("p"), nodeInfo("full", 5)); !st.IsSuccess() {
		t.Fatalf("a node with room beside the reservation: %v", st)
	}
	if _, st := r.plugin.SignPod(context.Background(), plain("p")); st.Code() != fwk.Unschedulable {
		t.Fatalf("plain pods are not batched while reservations exist: %v", st)
	}
	if s, _ := r.plugin.Score(context.Background(), state, plain("p"), nodeInfo("full", 8)); s != 0 {
		t.Fatalf("reserved node scores %d", s)
	}
	if s, _ := r.plugin.Score(context.Background(), state, plain("p"), nodeInfo("free", 8)); s != fwk.MaxNodeScore {
		t.Fatalf("free node scores %d", s)
	}
}

func TestPostFilterReportsTheRejectingPluginAndItsReason(t *testing.T) {
	r := newRig(t, true)
	state := framework.NewCycleState()
	state.Write(stateKey, &podState{group: "ns/g", node: "n1"})
	statuses := framework.NewDefaultNodeToStatus()
	statuses.Set("n1", fwk.NewStatus(fwk.Unschedulable, "Insufficient cpu").WithPlugin("NodeResourcesFit"))
	_, st := r.plugin.PostFilter(context.Background(), state, member("a", "g"), statuses)
	if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "rejected by NodeResourcesFit") {
		t.Fatalf("got %v", st)
	}
	if rej := r.svc.rejection; rej.GetNode() != "n1" || rej.GetPlugin() != "NodeResourcesFit" || rej.GetReason() != "Insufficient cpu" {
		t.Fatalf("reported %v", rej)
	}
	if _, st := r.plugin.PostFilter(context.Background(), framework.NewCycleState(), plain("p"), statuses); st.Code() != fwk.Unschedulable {
		t.Fatalf("plain pods go on to DefaultPreemption: %v", st)
	}
}

// requesting is a plain pod asking for the given resources only.
func requesting(requests v1.ResourceList) *v1.Pod {
	p := plain("r")
	p.Spec.Containers[0].Resources.Requests = requests
	return p
}

func TestReservedShortfallHoldsTheMirrorsCapacityInTheContractsUnits(t *testing.T) {
	gpu := v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	cpu := v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}
	mem := v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi")}
	for _, c := range []struct {
		name     string
		requests v1.ResourceList
		node     fwk.NodeInfo // 8 cpu, 110 pods, no memory unless set, gpus as given
		held     map[string]int64
		want     string
	}{
		{"cpu in millicores, exactly room", cpu, nodeInfo("n", 4), map[string]int64{"cpu": 7000}, ""},
		{"cpu in millicores, one short", cpu, nodeInfo("n", 4), map[string]int64{"cpu": 7001}, "cpu"},
		{"a scalar resource", gpu, nodeInfo("n", 4), map[string]int64{"nvidia.com/gpu": 3}, ""},
		{"pods already bound count", gpu, nodeInfo("n", 4, requesting(gpu)), map[string]int64{"nvidia.com/gpu": 3}, "nvidia.com/gpu"},
		{"memory in bytes", mem, withMemory(nodeInfo("n", 0), "2Gi"), map[string]int64{"memory": 1 << 30}, ""},
		{"memory in bytes, short", mem, withMemory(nodeInfo("n", 0), "2Gi"), map[string]int64{"memory": 1<<30 + 1}, "memory"},
		{"held but not requested", gpu, nodeInfo("n", 1), map[string]int64{"cpu": 8000, "memory": 1 << 40}, ""},
		{"held zero", gpu, nodeInfo("n", 1), map[string]int64{"nvidia.com/gpu": 0}, ""},
		{"the pod count: the last slot", gpu, nodeInfo("n", 4), map[string]int64{"pods": 109}, ""},
		{"the pod count: no slot left", gpu, nodeInfo("n", 4), map[string]int64{"pods": 110}, "pods"},
	} {
		if got := ReservedShortfall(c.requests, c.node, c.held); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func withMemory(ni fwk.NodeInfo, amount string) fwk.NodeInfo {
	node := ni.Node().DeepCopy()
	node.Status.Allocatable[v1.ResourceMemory] = resource.MustParse(amount)
	ni.SetNode(node)
	return ni
}

func TestFilterAndScoreFollowTheMirrorsPlansAndHeldCapacity(t *testing.T) {
	r := newRig(t, true)
	a := member("a", "g")
	r.plugin.Mirror().Apply(&pb.Reservations{Version: 1,
		Plans: []*pb.GroupPlan{gangPlan("ns/g", 1, "planned", map[string]string{"uid-a": "n1"})},
		Nodes: map[string]*pb.NodeReservation{"n1": {Amounts: map[string]int64{"nvidia.com/gpu": 4}}}})
	state := framework.NewCycleState()
	if res, st := r.plugin.PreFilter(context.Background(), state, a, nil); !st.IsSuccess() || !res.NodeNames.Has("n1") {
		t.Fatalf("member: %v %v", res, st)
	}
	if st := r.plugin.PreScore(context.Background(), state, a, nil); !st.IsSuccess() {
		t.Fatalf("a member is scored: %v", st)
	}
	// the member's own reservation does not keep it off its planned node
	if st := r.plugin.Filter(context.Background(), state, a, nodeInfo("n1", 4)); !st.IsSuccess() {
		t.Fatalf("the planned node: %v", st)
	}
	if s, _ := r.plugin.Score(context.Background(), state, a, nodeInfo("n1", 4)); s != fwk.MaxNodeScore {
		t.Fatalf("the planned node scores %d", s)
	}
	if s, _ := r.plugin.Score(context.Background(), state, a, nodeInfo("n2", 4)); s != 0 {
		t.Fatalf("another node scores %d", s)
	}
	plainState := framework.NewCycleState()
	if _, st := r.plugin.PreFilter(context.Background(), plainState, plain("p"), nil); !st.IsSuccess() {
		t.Fatalf("plain pod while n1 holds capacity: %v", st)
	}
	if st := r.plugin.Filter(context.Background(), plainState, plain("p"), nodeInfo("n1", 4)); st.Code() != fwk.Unschedulable {
		t.Fatalf("plain pod on the reserved node: %v", st)
	}
	// the stream ended: nothing is known reserved, plain pods skip the plugin again
	r.plugin.Mirror().Disconnect()
	if _, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), plain("p"), nil); st.Code() != fwk.Skip {
		t.Fatalf("plain pod after a disconnect: %v", st)
	}
	if st := r.plugin.PreScore(context.Background(), plainState, plain("p"), nil); st.Code() != fwk.Skip {
		t.Fatalf("plain pods are not scored while nothing is reserved: %v", st)
	}
	if st := r.plugin.Filter(context.Background(), plainState, plain("p"), nodeInfo("n1", 4)); !st.IsSuccess() {
		t.Fatalf("plain pod on n1 once its reservation is forgotten: %v", st)
	}
}
