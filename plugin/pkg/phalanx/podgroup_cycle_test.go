package phalanx

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// podGroupCycle is the cycle state of kube-scheduler's pod-group cycle (GenericWorkload on) while
// it simulates the group's placement: reservations made there are reverted before binding.
func podGroupCycle() *framework.CycleState {
	state := framework.NewCycleState()
	state.SetPodGroupSchedulingCycle(framework.NewCycleState())
	return state
}

func TestUnreserveOfThePodGroupCyclesSimulationIsNotReported(t *testing.T) {
	r := newRig(t, true)
	r.plugin.Unreserve(context.Background(), podGroupCycle(), member("a", "g"), "n1")
	// the same member's Unreserve outside the simulation (its binding failed) is reported
	r.plugin.Unreserve(context.Background(), framework.NewCycleState(), member("a", "g"), "n1")
	waitFor(t, "the real unreserve reported", func() bool { return r.svc.Calls("Unreserve") == 1 })
	time.Sleep(50 * time.Millisecond)
	if n := r.svc.Calls("Unreserve"); n != 1 {
		t.Fatalf("Unreserve calls: %d, want 1 (the simulation's revert is not one)", n)
	}
}

func TestInThePodGroupCycleAMemberWaitsForThePlanPastPlanWait(t *testing.T) {
	r, a, b := newSolvingRig(t)
	go func() {
		time.Sleep(100 * time.Millisecond) // five planWaits: a member outside the cycle is long answered
		close(r.svc.planGate)
	}()
	for _, m := range []*v1.Pod{a, b} {
		res, st := r.plugin.PreFilter(context.Background(), podGroupCycle(), m, nil)
		if !st.IsSuccess() || res == nil || res.NodeNames.Len() != 1 {
			t.Fatalf("member %s in the pod-group cycle: %v %v, want its planned node", m.Name, res, st)
		}
	}
	if n := r.svc.Calls("PlanForPod"); n != 1 {
		t.Fatalf("PlanForPod calls: %d, want 1", n)
	}
	// outside the pod-group cycle the member is still answered "being planned" past planWait
	c := member("c", "h")
	r.svc.planGate = make(chan struct{})
	defer close(r.svc.planGate)
	if _, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), c, nil); st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("outside the pod-group cycle: %v, want being planned", st)
	}
}

func TestAReserveInThePodGroupCyclesSimulationSaysSoAndTheRealOneFindsTheTrade(t *testing.T) {
	a, b := member("a", "g"), member("b", "g")
	r := newRig(t, true, a, b)
	r.svc.plan = &pb.PlanForPodReply{Verdict: pb.PlanForPodReply_PLANNED, Node: "n1", Plan: &pb.GroupPlan{
		Group: "ns/g", Id: 3, State: "planned", Gang: true,
		Assignments:  map[string]string{"uid-a": "n1", "uid-b": "n2"},
		TradeClasses: map[string]uint32{"uid-a": 0, "uid-b": 0}}}
	sim := podGroupCycle()
	if _, st := r.plugin.PreFilter(context.Background(), sim, a, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	if st := r.plugin.Reserve(context.Background(), sim, a, "n2"); !st.IsSuccess() {
		t.Fatalf("Reserve in the simulation: %v", st)
	}
	r.svc.mu.Lock()
	req := r.svc.reserveReq
	r.svc.mu.Unlock()
	if !req.GetSimulation() || req.GetTradedWith() != "uid-b" {
		t.Fatalf("the simulation's Reserve call: %v", req)
	}
	r.plugin.Unreserve(context.Background(), sim, a, "n2") // the simulation is reverted
	// the real Reserve (kube-scheduler's binding preparation, no PreFilter) finds a on n2: no call
	if st := r.plugin.Reserve(context.Background(), framework.NewCycleState(), a, "n2"); !st.IsSuccess() ||
		r.svc.Calls("Reserve") != 1 {
		t.Fatalf("the real Reserve: %v, %d calls", st, r.svc.Calls("Reserve"))
	}
}
