package phalanx

import (
	"context"
	"strings"
	"testing"

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
