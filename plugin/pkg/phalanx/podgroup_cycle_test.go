package phalanx

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
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
