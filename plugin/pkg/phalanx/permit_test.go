package phalanx

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

func TestPermitWaitsThenTheCompletingMembersReplyAllowsEveryWaitingMember(t *testing.T) {
	r := newRig(t, true)
	a, b := member("a", "g"), member("b", "g")
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, Reason: "1 of 2 members reserved", WaitSeconds: 30}
	st, wait := r.plugin.Permit(context.Background(), nil, a, "n1")
	if st.Code() != fwk.Wait || wait != r.plugin.args.PermitTimeout.Duration {
		t.Fatalf("first member: %v %v", st, wait)
	}
	waitingA := r.handle.wait(a)
	waitFor(t, "a's Permit call", func() bool { return r.svc.Calls("Permit") == 1 })
	if got := waitingA.Allowed(); len(got) != 0 {
		t.Fatalf("a was allowed on a wait reply: %v", got)
	}
	r.svc.mu.Lock()
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_ALLOW, AllowUids: []string{"uid-a", "uid-b"}}
	r.svc.mu.Unlock()
	// the completing member waits too (the scheduling loop does not wait for the record write);
	// its waiting pod is registered after Permit returned, as the framework does
	if st, _ := r.plugin.Permit(context.Background(), nil, b, "n2"); st.Code() != fwk.Wait {
		t.Fatalf("completing member: %v", st)
	}
	waitingB := r.handle.wait(b)
	waitFor(t, "both allowed", func() bool { return len(waitingA.Allowed()) == 1 && len(waitingB.Allowed()) == 1 })
	if waitingA.Allowed()[0] != Name || waitingB.Allowed()[0] != Name {
		t.Fatalf("allowed by %v, %v", waitingA.Allowed(), waitingB.Allowed())
	}
	st, _ = r.plugin.Permit(context.Background(), nil, plain("p"), "n1")
	if !st.IsSuccess() || r.svc.Calls("Permit") != 2 {
		t.Fatalf("plain pods are permitted without a call: %v, %d calls", st, r.svc.Calls("Permit"))
	}
}

func TestPermitRejectedByTheServiceRejectsTheWaitingMember(t *testing.T) {
	r := newRig(t, true)
	a := member("a", "g")
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_REJECT, Reason: "phalanx: podgroup ns/g holds no plan"}
	if st, _ := r.plugin.Permit(context.Background(), nil, a, "n1"); st.Code() != fwk.Wait {
		t.Fatalf("got %v", st)
	}
	waiting := r.handle.wait(a)
	waitFor(t, "the rejection", func() bool {
		waiting.mu.Lock()
		defer waiting.mu.Unlock()
		return strings.Contains(waiting.rejected, "holds no plan")
	})
}

func TestUnreserveRejectsTheRestOfTheGang(t *testing.T) {
	r := newRig(t, true)
	r.svc.unreserve = &pb.UnreserveReply{RejectUids: []string{"uid-b", "uid-c"}}
	r.plugin.Unreserve(context.Background(), nil, member("a", "g"), "n1")
	waitFor(t, "the rejections", func() bool {
		r.handle.mu.Lock()
		defer r.handle.mu.Unlock()
		return len(r.handle.rejected) == 2
	})
}

// A member whose Reserve was refused (the service holds a newer plan than the mirror) never reached
// the barrier: its Unreserve says "unreserved", which leaves the service's plan standing. Only a
// member that reached Permit and is no longer waiting there was rejected at the barrier.
func TestUnreserveSaysRejectedOnlyForAMemberThatReachedPermit(t *testing.T) {
	a := member("a", "g")
	r := newRig(t, true, a)
	refused := framework.NewCycleState()
	r.plugin.Unreserve(context.Background(), refused, a, "n1")
	waitFor(t, "the first Unreserve call", func() bool { return len(r.svc.UnreserveReasons()) == 1 })
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, Reason: "1 of 2 members reserved", WaitSeconds: 30}
	waited := framework.NewCycleState()
	if st, _ := r.plugin.Permit(context.Background(), waited, a, "n1"); st.Code() != fwk.Wait {
		t.Fatalf("Permit: %v", st)
	}
	// kube-scheduler took the member out of its waiting pods (a Permit timeout) before Unreserve
	r.plugin.Unreserve(context.Background(), waited, a, "n1")
	waitFor(t, "the second Unreserve call", func() bool { return len(r.svc.UnreserveReasons()) == 2 })
	if got := r.svc.UnreserveReasons(); got[0] != "unreserved" || got[1] != "rejected" {
		t.Fatalf("reasons: %v, want [unreserved rejected]", got)
	}
}

func TestReserveOnTheMirrorsPlannedNodeMakesNoCallAndPermitReportsTheMemberReserved(t *testing.T) {
	a, b := member("a", "g"), member("b", "g")
	r := newRig(t, true, a, b)
	r.svc.plan = &pb.PlanForPodReply{Verdict: pb.PlanForPodReply_PLANNED, Node: "n1", Plan: &pb.GroupPlan{
		Group: "ns/g", Id: 7, State: "planned", Gang: true, Assignments: map[string]string{"uid-a": "n1", "uid-b": "n2"}}}
	if _, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), a, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	if st := r.plugin.Reserve(context.Background(), nil, a, "n1"); !st.IsSuccess() || r.svc.Calls("Reserve") != 0 {
		t.Fatalf("reserve on the planned node: %v, %d calls", st, r.svc.Calls("Reserve"))
	}
	// assumed somewhere the mirror does not plan it: the service decides
	if st := r.plugin.Reserve(context.Background(), nil, b, "n9"); !st.IsSuccess() || r.svc.Calls("Reserve") != 1 {
		t.Fatalf("reserve off the mirror's plan: %v, %d calls", st, r.svc.Calls("Reserve"))
	}
	firstPermitWaits(t, r, a)
	r.svc.mu.Lock()
	defer r.svc.mu.Unlock()
	if got := r.svc.permitReq.GetReservedUids(); len(got) != 1 || got[0] != "uid-a" || r.svc.permitReq.GetNode() != "n1" {
		t.Fatalf("the Permit call names the member reserved on its node: %v", r.svc.permitReq)
	}
}

func TestAGangsMembersAtPermitShareTheirGroupsCalls(t *testing.T) {
	r := newRig(t, true)
	assignments := map[string]string{}
	var pods []*v1.Pod
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		pods = append(pods, member(name, "g"))
		assignments["uid-"+name] = "n-" + name
	}
	r.plugin.mirror.PutPlan(&pb.GroupPlan{Group: "ns/g", Id: 3, State: "planned", Gang: true, Assignments: assignments})
	r.svc.permitGate = make(chan struct{})
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, Reason: "1 of 5 members reserved", WaitSeconds: 30}
	var waiting []*fakeWaitingPod
	st, _ := r.plugin.Permit(context.Background(), nil, pods[0], "n-a")
	if st.Code() != fwk.Wait {
		t.Fatalf("first member: %v", st)
	}
	waiting = append(waiting, r.handle.wait(pods[0]))
	waitFor(t, "the first member's call in flight", func() bool { return r.svc.Calls("Permit") == 1 })
	for _, m := range pods[1:] { // reach Permit while that call is in flight
		if st, _ := r.plugin.Permit(context.Background(), nil, m, "n-"+m.Name); st.Code() != fwk.Wait {
			t.Fatalf("member %s: %v", m.Name, st)
		}
		waiting = append(waiting, r.handle.wait(m))
	}
	waitFor(t, "the four queued behind it", func() bool {
		r.plugin.mu.Lock()
		defer r.plugin.mu.Unlock()
		return len(r.plugin.permitting["ns/g"]) == 4
	})
	r.svc.mu.Lock()
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_ALLOW, AllowUids: []string{"uid-a", "uid-b", "uid-c", "uid-d", "uid-e"}}
	r.svc.mu.Unlock()
	close(r.svc.permitGate)
	waitFor(t, "every member allowed", func() bool {
		for _, w := range waiting {
			if len(w.Allowed()) == 0 {
				return false
			}
		}
		return true
	})
	r.svc.mu.Lock()
	defer r.svc.mu.Unlock()
	if len(r.svc.permitReqs) != 2 {
		t.Fatalf("Permit calls: %d, want 2 (the first member's, then one for the four queued)", len(r.svc.permitReqs))
	}
	second := r.svc.permitReqs[1]
	if got := sets.New(second.GetReservedUids()...); !got.Equal(sets.New("uid-b", "uid-c", "uid-d", "uid-e")) ||
		!got.Has(second.GetPodUid()) {
		t.Fatalf("second call: pod %s reserved %v, want the four queued", second.GetPodUid(), second.GetReservedUids())
	}
}

func TestAMemberAssumedOffItsPlannedNodeCallsAlone(t *testing.T) {
	r := newRig(t, true)
	r.plugin.mirror.PutPlan(&pb.GroupPlan{Group: "ns/g", Id: 3, State: "planned", Gang: true,
		Assignments: map[string]string{"uid-a": "n1", "uid-b": "n2"}})
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, WaitSeconds: 30}
	r.plugin.Permit(context.Background(), nil, member("a", "g"), "elsewhere")
	r.handle.wait(member("a", "g"))
	waitFor(t, "its call", func() bool { return r.svc.Calls("Permit") == 1 })
	r.plugin.mu.Lock()
	defer r.plugin.mu.Unlock()
	if _, queued := r.plugin.permitting["ns/g"]; queued {
		t.Fatal("a member off its planned node opened the group's shared calls")
	}
}

func TestPermitTellsTheServiceWhetherKubeSchedulerWritesTheGroupsCondition(t *testing.T) {
	for _, byScheduler := range []bool{false, true} {
		r := newRig(t, true)
		r.plugin.conditionByScheduler = byScheduler
		firstPermitWaits(t, r, member("a", "g"))
		r.svc.mu.Lock()
		got := r.svc.permitReqs[0].GetConditionByScheduler()
		r.svc.mu.Unlock()
		if got != byScheduler {
			t.Fatalf("condition_by_scheduler = %v, want %v", got, byScheduler)
		}
	}
}

// firstPermitWaits: member a (on n1) calls Permit, the service answers wait, the call is made.
func firstPermitWaits(t *testing.T, r *rig, a *v1.Pod) {
	t.Helper()
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, Reason: "1 of 2 members reserved", WaitSeconds: 30}
	if st, _ := r.plugin.Permit(context.Background(), nil, a, "n1"); st.Code() != fwk.Wait {
		t.Fatalf("Permit: %v", st)
	}
	r.handle.wait(a)
	waitFor(t, "a's Permit call", func() bool { return r.svc.Calls("Permit") == 1 })
}

func TestAMemberOfATradeClassIsOfferedItsClassmatesNodesAndTradesWithTheOneItIsReservedOn(t *testing.T) {
	a, b, c := member("a", "g"), member("b", "g"), member("c", "g")
	r := newRig(t, true, a, b, c)
	r.svc.plan = &pb.PlanForPodReply{Verdict: pb.PlanForPodReply_PLANNED, Node: "n1", Plan: &pb.GroupPlan{
		Group: "ns/g", Id: 7, State: "planned", Gang: true,
		Assignments:  map[string]string{"uid-a": "n1", "uid-b": "n2", "uid-c": "n3"},
		TradeClasses: map[string]uint32{"uid-a": 0, "uid-b": 0, "uid-c": 0}}}
	state := framework.NewCycleState()
	res, st := r.plugin.PreFilter(context.Background(), state, a, nil)
	if !st.IsSuccess() || !res.NodeNames.Equal(sets.New("n1", "n2", "n3")) {
		t.Fatalf("PreFilter: %v %v, want its own node and its classmates'", res, st)
	}
	// kube-scheduler's filters refused n1 for now (another member assumed first): a lands on b's node
	if st := r.plugin.Reserve(context.Background(), state, a, "n2"); !st.IsSuccess() || r.svc.Calls("Reserve") != 1 {
		t.Fatalf("reserve on a classmate's node: %v, %d calls", st, r.svc.Calls("Reserve"))
	}
	r.svc.mu.Lock()
	req := r.svc.reserveReq
	r.svc.mu.Unlock()
	if req.GetNode() != "n2" || req.GetTradedWith() != "uid-b" {
		t.Fatalf("the Reserve call names the trade: %v", req)
	}
	plannedNode(t, r.plugin.mirror, "uid-a", "n2")
	plannedNode(t, r.plugin.mirror, "uid-b", "n1")
	// b is offered its new node and c's, not a's (a is reserved)
	res, st = r.plugin.PreFilter(context.Background(), framework.NewCycleState(), b, nil)
	if !st.IsSuccess() || !res.NodeNames.Equal(sets.New("n1", "n3")) {
		t.Fatalf("PreFilter b: %v %v", res, st)
	}
	// on its own planned node, no call and no trade
	if st := r.plugin.Reserve(context.Background(), state, b, "n1"); !st.IsSuccess() || r.svc.Calls("Reserve") != 1 {
		t.Fatalf("reserve b on its node: %v, %d calls", st, r.svc.Calls("Reserve"))
	}
}

// A snapshot naming members left by a dropped gang plan rejects them at their barrier: nothing will
// allow them, and kube-scheduler holds their nodes' capacity until they leave. Others stay waiting.
func TestASnapshotsLeftMembersAreRejectedAtTheBarrier(t *testing.T) {
	a, b := member("a", "g"), member("b", "g")
	r := newRig(t, true, a, b)
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, Reason: "1 of 3 members reserved", WaitSeconds: 30}
	for _, m := range []*v1.Pod{a, b} {
		if st, _ := r.plugin.Permit(context.Background(), framework.NewCycleState(), m, "n1"); st.Code() != fwk.Wait {
			t.Fatalf("Permit %s: %v", m.Name, st)
		}
		r.handle.wait(m)
	}
	waitFor(t, "the Permit calls", func() bool { return r.svc.Calls("Permit") == 2 })
	r.svc.snapshots <- &pb.Reservations{Version: 1}
	r.svc.snapshots <- &pb.Reservations{Version: 2, RejectUids: []string{"uid-a"}}
	waitFor(t, "a's rejection", func() bool {
		r.handle.mu.Lock()
		defer r.handle.mu.Unlock()
		return len(r.handle.rejected) > 0
	})
	r.svc.snapshots <- &pb.Reservations{Version: 3}
	waitFor(t, "the last snapshot", func() bool { return len(r.svc.snapshots) == 0 })
	r.handle.mu.Lock()
	defer r.handle.mu.Unlock()
	if len(r.handle.rejected) != 1 || r.handle.rejected[0] != "uid-a" {
		t.Fatalf("rejected %v, want [uid-a]", r.handle.rejected)
	}
}

// A Permit call names where kube-scheduler assumed each member it reports reserved: the service's
// plan may be newer than the mirror they were reserved against.
func TestPermitNamesTheNodeEachReservedMemberWasAssumedOn(t *testing.T) {
	a := member("a", "g")
	r := newRig(t, true, a)
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, Reason: "1 of 2 members reserved", WaitSeconds: 30}
	if st, _ := r.plugin.Permit(context.Background(), framework.NewCycleState(), a, "n3"); st.Code() != fwk.Wait {
		t.Fatalf("Permit: %v", st)
	}
	r.handle.wait(a)
	waitFor(t, "a's Permit call", func() bool { return r.svc.Calls("Permit") == 1 })
	r.svc.mu.Lock()
	defer r.svc.mu.Unlock()
	if got := r.svc.permitReq.GetReservedNodes(); len(got) != 1 || got["uid-a"] != "n3" {
		t.Fatalf("reserved nodes %v, want map[uid-a:n3]", got)
	}
}
