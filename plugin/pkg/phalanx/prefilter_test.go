package phalanx

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

func TestPreFilterAsksOncePerGroupCycleAndAnswersTheRestFromTheCachedPlan(t *testing.T) {
	a, b := member("a", "g"), member("b", "g")
	r := newRig(t, true, a, b, plain("p"))
	r.svc.plan = &pb.PlanForPodReply{Verdict: pb.PlanForPodReply_PLANNED, Node: "n1", Plan: &pb.GroupPlan{
		Group: "ns/g", Id: 7, State: "planned", Gang: true, Assignments: map[string]string{"uid-a": "n1", "uid-b": "n2"}}}
	res, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), a, nil)
	if !st.IsSuccess() || res.NodeNames.UnsortedList()[0] != "n1" || res.NodeNames.Len() != 1 {
		t.Fatalf("member a: %v %v", res, st)
	}
	if got := r.svc.lastPod["metadata"].(map[string]any)["uid"]; got != "uid-a" {
		t.Fatalf("the pod goes to the service as JSON, got uid %v", got)
	}
	res, st = r.plugin.PreFilter(context.Background(), framework.NewCycleState(), b, nil)
	if !st.IsSuccess() || !res.NodeNames.Has("n2") {
		t.Fatalf("member b: %v %v", res, st)
	}
	if n := r.svc.Calls("PlanForPod"); n != 1 {
		t.Fatalf("PlanForPod calls: %d, want 1", n)
	}
	waitFor(t, "the other member activated", func() bool {
		r.handle.mu.Lock()
		defer r.handle.mu.Unlock()
		return len(r.handle.activated) > 0
	})
	if got := r.handle.activated; len(got) != 1 || got[0] != "ns/b" {
		t.Fatalf("a new plan activates the other pending members only: %v", got)
	}
}

func TestPreFilterWaitsWithTheServicesReason(t *testing.T) {
	r := newRig(t, true)
	r.svc.plan = &pb.PlanForPodReply{Verdict: pb.PlanForPodReply_WAIT, Reason: "podgroup ns/g: waiting for members, 2 of 3 exist"}
	_, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), member("a", "g"), nil)
	if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "2 of 3") {
		t.Fatalf("got %v", st)
	}
}

func TestPreFilterPastPlanWaitAnswersBeingPlannedAndActivatesTheGroupWhenThePlanLands(t *testing.T) {
	r, a, b := newSolvingRig(t)
	for _, m := range []*v1.Pod{a, b} {
		_, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), m, nil)
		if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "being planned") {
			t.Fatalf("member %s while the solve runs: %v", m.Name, st)
		}
	}
	// a member joining the call once its planWait is over does not wait another planWait
	r.plugin.mu.Lock()
	call := r.plugin.planning["ns/g"]
	r.plugin.mu.Unlock()
	if call == nil || time.Now().Before(call.wait) {
		t.Fatalf("the call's planWait should be over: %v", call)
	}
	if n := r.svc.Calls("PlanForPod"); n != 1 {
		t.Fatalf("PlanForPod calls while one is in flight: %d, want 1", n)
	}
	if got := r.handle.Activated(); len(got) != 0 {
		t.Fatalf("activated before the plan: %v", got)
	}
	events, _ := r.plugin.EventsToRegister(context.Background())
	for _, e := range events {
		if hint, _ := e.QueueingHintFn(klog.Background(), a, nil, b); hint != fwk.QueueSkip {
			t.Fatalf("%v retries a member whose group is being planned", e.Event)
		}
		if hint, _ := e.QueueingHintFn(klog.Background(), member("c", "other"), nil, b); hint != fwk.Queue {
			t.Fatalf("%v skips a member of a group not being planned", e.Event)
		}
	}
	close(r.svc.planGate)
	waitFor(t, "both members activated", func() bool { return len(r.handle.Activated()) >= 2 })
	if hint, _ := r.plugin.unlessPlanning(klog.Background(), a, nil, b); hint != fwk.Queue {
		t.Fatal("events retry the group's members again once its plan landed")
	}
	res, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), b, nil)
	if !st.IsSuccess() || !res.NodeNames.Has("n2") || r.svc.Calls("PlanForPod") != 1 {
		t.Fatalf("after the plan landed: %v %v, %d calls", res, st, r.svc.Calls("PlanForPod"))
	}
}

func TestATouchWhileTheGroupIsPlannedRetriesItsMembersWhenTheReplyIsNotAPlan(t *testing.T) {
	r, a, b := newSolvingRig(t)
	r.svc.plan = &pb.PlanForPodReply{Verdict: pb.PlanForPodReply_WAIT, Reason: "podgroup ns/g: no placement"}
	if _, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), a, nil); st.IsSuccess() {
		t.Fatalf("member a while the solve runs: %v", st)
	}
	// phalanx serve saw room the call in flight may not have seen, and touched member b
	touchedB := b.DeepCopy()
	touchedB.Annotations = map[string]string{AnnotationRetry: "1764800000000001"}
	events, _ := r.plugin.EventsToRegister(context.Background())
	for _, e := range events {
		if hint, _ := e.QueueingHintFn(klog.Background(), b, b, touchedB); hint != fwk.QueueSkip {
			t.Fatalf("%v retries a member whose group is being planned", e.Event)
		}
	}
	close(r.svc.planGate)
	waitFor(t, "the group's members retried after the reply", func() bool { return len(r.handle.Activated()) >= 2 })
	if got := r.handle.Activated(); !slices.Contains(got, "ns/a") || !slices.Contains(got, "ns/b") {
		t.Fatalf("every pending member, the one that took the reply too: %v", got)
	}
}

func TestAnUntouchedGroupIsNotRetriedWhenItsReplyIsNotAPlan(t *testing.T) {
	r, a, b := newSolvingRig(t)
	r.svc.plan = &pb.PlanForPodReply{Verdict: pb.PlanForPodReply_WAIT, Reason: "podgroup ns/g: no placement"}
	r.plugin.args.PlanWait.Duration = time.Minute // a takes the reply itself: nothing is late
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r.plugin.PreFilter(context.Background(), framework.NewCycleState(), a, nil)
	}()
	waitFor(t, "the call", func() bool { return r.svc.Calls("PlanForPod") == 1 })
	relabelled := b.DeepCopy()
	relabelled.Labels = map[string]string{"other": "change"}
	if hint, _ := r.plugin.unlessPlanning(klog.Background(), b, b, relabelled); hint != fwk.QueueSkip {
		t.Fatal("an update of a member whose group is being planned is skipped")
	}
	close(r.svc.planGate)
	<-done
	time.Sleep(50 * time.Millisecond) // an activation would have happened by now
	if got := r.handle.Activated(); len(got) != 0 {
		t.Fatalf("an update other than a touch retries nobody: %v", got)
	}
}

func TestOnePlanForPodCallAtATimeAcrossGroups(t *testing.T) {
	r := newRigWait(t, true, 10*time.Millisecond)
	r.svc.planGate = make(chan struct{})
	r.svc.plan = &pb.PlanForPodReply{Verdict: pb.PlanForPodReply_WAIT, Reason: "no placement"}
	for _, g := range []string{"g", "h"} {
		if _, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), member("a-"+g, g), nil); st.IsSuccess() {
			t.Fatalf("group %s: %v", g, st)
		}
	}
	waitFor(t, "the first call", func() bool { return r.svc.Calls("PlanForPod") == 1 })
	time.Sleep(50 * time.Millisecond) // the second group's call would have reached the service by now
	if n := r.svc.Calls("PlanForPod"); n != 1 {
		t.Fatalf("calls in flight at once: %d, want 1", n)
	}
	close(r.svc.planGate)
	waitFor(t, "the second call", func() bool { return r.svc.Calls("PlanForPod") == 2 })
}

func TestPreEnqueueHoldsMembersOfWaitingGroupsAndActivatesThemWhenComplete(t *testing.T) {
	r := newRig(t, true)
	r.svc.snapshots <- &pb.Reservations{Version: 1, WaitingGroups: []string{"ns/g"}}
	waitFor(t, "the snapshot", func() bool { return r.plugin.Mirror().Waiting("ns/g") })
	if st := r.plugin.PreEnqueue(context.Background(), member("a", "g")); st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("waiting member: %v", st)
	}
	if st := r.plugin.PreEnqueue(context.Background(), member("a", "other")); !st.IsSuccess() {
		t.Fatalf("member of a complete group: %v", st)
	}
	if st := r.plugin.PreEnqueue(context.Background(), plain("p")); !st.IsSuccess() {
		t.Fatalf("plain pod: %v", st)
	}
	progress := r.plugin.Mirror().Apply(&pb.Reservations{Version: 2})
	if len(progress) != 1 || progress[0] != "ns/g" {
		t.Fatalf("a group no longer waiting is progress: %v", progress)
	}
	// the service said "members missing" before any snapshot listed the group as waiting
	r.plugin.Mirror().MembersMissing("ns/h")
	if progress := r.plugin.Mirror().Apply(&pb.Reservations{Version: 3, WaitingGroups: []string{"ns/h"}}); len(progress) != 0 {
		t.Fatalf("still waiting: %v", progress)
	}
	if progress := r.plugin.Mirror().Apply(&pb.Reservations{Version: 4}); len(progress) != 1 || progress[0] != "ns/h" {
		t.Fatalf("complete now: %v", progress)
	}
	if progress := r.plugin.Mirror().Apply(&pb.Reservations{Version: 5}); len(progress) != 0 {
		t.Fatalf("reported once: %v", progress)
	}
}

// A member turned away because serve did not answer is moved back to the active queue after
// retryAfter: kube-scheduler would otherwise keep it aside until an unrelated cluster event, and a
// gang that arrived during an outage stayed pending at rest once serve was back.
func TestMembersTurnedAwayWhileServeIsDownAreRetriedAfterTheCooldown(t *testing.T) {
	a, b := member("a", "g"), member("b", "g")
	r := newRig(t, false, a, b)
	r.plugin.retryAfter = 50 * time.Millisecond
	_, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), a, nil)
	if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "did not answer") {
		t.Fatalf("serve down: %v", st)
	}
	if got := r.handle.Activated(); len(got) != 0 {
		t.Fatalf("activated before the cooldown: %v", got)
	}
	waitFor(t, "the group's members activated", func() bool {
		got := strings.Join(r.handle.Activated(), ",")
		return strings.Contains(got, "ns/a") && strings.Contains(got, "ns/b")
	})
}

// A group whose preemption's victims are still terminating cannot fit before they are gone: its
// members are held out of kube-scheduler's queue (PreEnqueue), answered without a call when a
// pod-group cycle meets them anyway (PreFilter), not retried on the victims' deletions (queueing
// hint), and moved back to the queue by the snapshot that no longer lists the group.
func TestMembersOfAGroupWaitingForItsVictimsAreHeldWithoutCallsAndReleasedWhenTheyGo(t *testing.T) {
	a, b := member("a", "g"), member("b", "g")
	r := newRig(t, true, a, b)
	r.svc.snapshots <- &pb.Reservations{Version: 1} // the stream's first snapshot retries every member
	waitFor(t, "the first snapshot", func() bool { return len(r.handle.Activated()) == 2 })
	r.svc.snapshots <- &pb.Reservations{Version: 2, PreemptingGroups: []string{"ns/g"}}
	waitFor(t, "the snapshot", func() bool { return r.plugin.Mirror().Preempting("ns/g") })
	for _, m := range []*v1.Pod{a, b} {
		st := r.plugin.PreEnqueue(context.Background(), m)
		if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "preemption evicts") {
			t.Fatalf("PreEnqueue of member %s: %v", m.Name, st)
		}
		_, st = r.plugin.PreFilter(context.Background(), framework.NewCycleState(), m, nil)
		if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "preemption evicts") {
			t.Fatalf("PreFilter of member %s: %v", m.Name, st)
		}
	}
	if n := r.svc.Calls("PlanForPod"); n != 0 {
		t.Fatalf("PlanForPod calls for a group waiting for its victims: %d, want 0", n)
	}
	if st := r.plugin.PreEnqueue(context.Background(), member("c", "other")); !st.IsSuccess() {
		t.Fatalf("a member of another group: %v", st)
	}
	events, _ := r.plugin.EventsToRegister(context.Background())
	victim := plain("victim")
	for _, e := range events {
		if hint, _ := e.QueueingHintFn(klog.Background(), a, victim, nil); hint != fwk.QueueSkip {
			t.Fatalf("%v retries a member whose group waits for its victims", e.Event)
		}
	}
	if got := r.handle.Activated(); len(got) != 2 {
		t.Fatalf("activated while the victims go: %v", got[2:])
	}
	// the last victim went: the next snapshot no longer lists the group
	r.svc.snapshots <- &pb.Reservations{Version: 3}
	waitFor(t, "both members moved back to the queue", func() bool { return len(r.handle.Activated()) >= 4 })
	if got := r.handle.Activated()[2:]; !slices.Contains(got, "ns/a") || !slices.Contains(got, "ns/b") {
		t.Fatalf("activated: %v", got)
	}
	if st := r.plugin.PreEnqueue(context.Background(), a); !st.IsSuccess() {
		t.Fatalf("PreEnqueue once the victims are gone: %v", st)
	}
	if hint, _ := r.plugin.unlessPlanning(klog.Background(), a, victim, nil); hint != fwk.Queue {
		t.Fatal("events retry the group's members again once the victims are gone")
	}
	// a disconnected stream holds nothing back (serve down never blocks a group)
	r.plugin.Mirror().Apply(&pb.Reservations{Version: 4, PreemptingGroups: []string{"ns/g"}})
	r.plugin.Mirror().Disconnect()
	if r.plugin.Mirror().Preempting("ns/g") {
		t.Fatal("a disconnected mirror holds no group back")
	}
}

// A group the service has still to try planning ahead (phalanx/hold-until-tried): its members are
// held out of the queue and not retried by events; the snapshot that carries its plan moves them
// back (as any new plan does), and so does one that no longer lists it without a plan (plan ahead
// found it does not fit: its members then ask as before). A group held by nothing here is not
// reported when it leaves the list, and a group holding a plan is never held.
func TestMembersOfAGroupNotYetTriedAheadAreHeldUntilItsPlanOrItsTry(t *testing.T) {
	a, b, c := member("a", "g"), member("b", "g"), member("c", "h")
	r := newRig(t, true, a, b, c)
	r.svc.snapshots <- &pb.Reservations{Version: 1}
	waitFor(t, "the first snapshot", func() bool { return len(r.handle.Activated()) == 3 })
	mirror := r.plugin.Mirror()
	mirror.Apply(&pb.Reservations{Version: 2, UntriedGroups: []string{"ns/g", "ns/h", "ns/k"}})
	for _, m := range []*v1.Pod{a, b, c} {
		st := r.plugin.PreEnqueue(context.Background(), m)
		if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "being planned") {
			t.Fatalf("PreEnqueue of member %s: %v", m.Name, st)
		}
		if hint, _ := r.plugin.unlessPlanning(klog.Background(), m, plain("x"), nil); hint != fwk.QueueSkip {
			t.Fatalf("an event retries member %s of a group not yet tried", m.Name)
		}
	}
	if st := r.plugin.PreEnqueue(context.Background(), member("d", "other")); !st.IsSuccess() {
		t.Fatalf("a member of a group not listed: %v", st)
	}
	// g planned ahead: its plan is progress; h tried without a plan: progress too; k, never held
	// here, is not
	progress := mirror.Apply(&pb.Reservations{Version: 3, Plans: []*pb.GroupPlan{
		{Group: "ns/g", Id: 1, Gang: true, State: "planned", Assignments: map[string]string{"uid-a": "n1", "uid-b": "n2"}}}})
	slices.Sort(progress)
	if !slices.Equal(progress, []string{"ns/g", "ns/h"}) {
		t.Fatalf("progress: %v", progress)
	}
	if progress := mirror.Apply(&pb.Reservations{Version: 4}); len(progress) != 0 {
		t.Fatalf("reported once: %v", progress)
	}
	// a group listed while the mirror holds its plan (a PlanForPod reply came first) is not held
	mirror.PutPlan(&pb.GroupPlan{Group: "ns/h", Id: 2, Gang: true, State: "planned", Assignments: map[string]string{"uid-c": "n3"}})
	mirror.Apply(&pb.Reservations{Version: 5, UntriedGroups: []string{"ns/h"}, Plans: []*pb.GroupPlan{
		{Group: "ns/h", Id: 2, Gang: true, State: "planned", Assignments: map[string]string{"uid-c": "n3"}}}})
	if st := r.plugin.PreEnqueue(context.Background(), c); !st.IsSuccess() {
		t.Fatalf("a member whose plan the mirror holds: %v", st)
	}
	// one that moves from the list to its preemption is not moved back before its victims are gone
	mirror.Apply(&pb.Reservations{Version: 6, UntriedGroups: []string{"ns/g"}})
	r.plugin.PreEnqueue(context.Background(), a)
	if progress := mirror.Apply(&pb.Reservations{Version: 7, PreemptingGroups: []string{"ns/g"}}); len(progress) != 0 {
		t.Fatalf("a group now waiting for its victims: %v", progress)
	}
	if progress := mirror.Apply(&pb.Reservations{Version: 8}); !slices.Equal(progress, []string{"ns/g"}) {
		t.Fatalf("its victims gone: %v", progress)
	}
	// its victims gone, the group is planned ahead again in the room they freed: held until its plan
	mirror.Apply(&pb.Reservations{Version: 9, PreemptingGroups: []string{"ns/g"}})
	if progress := mirror.Apply(&pb.Reservations{Version: 10, UntriedGroups: []string{"ns/g"}}); len(progress) != 0 {
		t.Fatalf("victims gone, not yet planned: %v", progress)
	}
	if progress := mirror.Apply(&pb.Reservations{Version: 11}); !slices.Equal(progress, []string{"ns/g"}) {
		t.Fatalf("tried after its victims went: %v", progress)
	}
	// a disconnected stream holds nothing back
	mirror.Apply(&pb.Reservations{Version: 12, UntriedGroups: []string{"ns/g"}})
	mirror.Disconnect()
	if st := r.plugin.PreEnqueue(context.Background(), a); !st.IsSuccess() {
		t.Fatalf("a disconnected mirror holds a group back: %v", st)
	}
}
