package phalanx

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

func claimMember(name, group string) *v1.Pod {
	p := member(name, group)
	claim := "shared-gpu"
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	return p
}

// preBind runs the member's PreBind in the background (as its binding goroutine would).
func preBind(r *rig, pod *v1.Pod) chan *fwk.Status {
	done := make(chan *fwk.Status, 1)
	go func() { done <- r.plugin.PreBind(context.Background(), nil, pod, "n1") }()
	return done
}

func TestMembersNamingAClaimPassPermitAndWaitInPreBindUntilTheCompletingMemberAllowsThem(t *testing.T) {
	r := newRig(t, true)
	a, b := claimMember("a", "g"), claimMember("b", "g")
	if st, _ := r.plugin.Permit(context.Background(), nil, a, "n1"); !st.IsSuccess() {
		t.Fatalf("a member naming a claim waits at Permit: %v", st)
	}
	templated := member("t", "g")
	template := "per-pod"
	templated.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &template}}
	for _, pod := range []*v1.Pod{plain("p"), member("m", "g"), templated} {
		if _, st := r.plugin.PreBindPreFlight(context.Background(), nil, pod, "n1"); st.Code() != fwk.Skip {
			t.Fatalf("PreBind has nothing to do for %s: %v", pod.Name, st)
		}
		if st := r.plugin.PreBind(context.Background(), nil, pod, "n1"); !st.IsSuccess() {
			t.Fatalf("PreBind of %s: %v", pod.Name, st)
		}
	}
	if _, st := r.plugin.PreBindPreFlight(context.Background(), nil, a, "n1"); !st.IsSuccess() {
		t.Fatalf("PreBind has work for a member naming a claim: %v", st)
	}
	if n := r.svc.Calls("Permit"); n != 0 {
		t.Fatalf("Permit calls before PreBind: %d", n)
	}
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, Reason: "1 of 2 members reserved", WaitSeconds: 30}
	doneA := preBind(r, a)
	waitFor(t, "a's Permit call from PreBind", func() bool { return r.svc.Calls("Permit") == 1 })
	select {
	case st := <-doneA:
		t.Fatalf("a left PreBind on a wait reply: %v", st)
	case <-time.After(50 * time.Millisecond):
	}
	r.svc.mu.Lock()
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_ALLOW, AllowUids: []string{"uid-a", "uid-b"}}
	r.svc.mu.Unlock()
	if st := r.plugin.PreBind(context.Background(), nil, b, "n2"); !st.IsSuccess() {
		t.Fatalf("the completing member: %v", st)
	}
	if st := <-doneA; !st.IsSuccess() {
		t.Fatalf("a after the completing member's reply: %v", st)
	}
	r.svc.mu.Lock()
	defer r.svc.mu.Unlock()
	if r.svc.permitReq.GetPodUid() != "uid-b" || r.svc.permitReq.GetNode() != "n2" {
		t.Fatalf("the completing member's call: %v", r.svc.permitReq)
	}
}

func TestAMemberWaitingInPreBindIsRejectedWithItsGangOrFailsAtTheTimeout(t *testing.T) {
	r := newRig(t, true)
	r.plugin.args.PermitTimeout.Duration = 100 * time.Millisecond
	r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, Reason: "1 of 3 members reserved", WaitSeconds: 30}
	if st := <-preBind(r, claimMember("a", "g")); st.Code() != fwk.Unschedulable ||
		!strings.Contains(st.Message(), "not complete within 100ms") {
		t.Fatalf("past permitTimeout: %v", st)
	}
	r.plugin.args.PermitTimeout.Duration = time.Hour
	b := claimMember("b", "g")
	doneB := preBind(r, b)
	waitFor(t, "b waiting in PreBind", func() bool {
		r.plugin.mu.Lock()
		defer r.plugin.mu.Unlock()
		return r.plugin.atPreBind[b.UID] != nil
	})
	r.svc.unreserve = &pb.UnreserveReply{RejectUids: []string{"uid-b"}}
	r.plugin.Unreserve(context.Background(), nil, claimMember("c", "g"), "n3")
	if st := <-doneB; st.Code() != fwk.Unschedulable || !strings.Contains(st.Message(), "c left the barrier") {
		t.Fatalf("b after c was rejected: %v", st)
	}
	r.handle.mu.Lock()
	defer r.handle.mu.Unlock()
	if len(r.handle.rejected) != 0 {
		t.Fatalf("a member in PreBind is not a waiting pod: %v", r.handle.rejected)
	}
}

func TestWithoutPhalanxAtPreBindAfterDynamicResourcesMembersNamingAClaimWaitAtPermit(t *testing.T) {
	for _, preBind := range [][]string{{"VolumeBinding", "DynamicResources"}, {Name, "DynamicResources"}} {
		r := newRig(t, true)
		r.handle.preBind = preBind
		a := claimMember("a", "g")
		r.svc.permit = &pb.PermitReply{Decision: pb.PermitReply_WAIT, Reason: "1 of 2 members reserved", WaitSeconds: 30}
		if st, _ := r.plugin.Permit(context.Background(), nil, a, "n1"); st.Code() != fwk.Wait {
			t.Fatalf("PreBind plugins %v: a member naming a claim must wait at Permit: %v", preBind, st)
		}
		if _, st := r.plugin.PreBindPreFlight(context.Background(), nil, a, "n1"); st.Code() != fwk.Skip {
			t.Fatalf("PreBind plugins %v: PreBind has nothing to do: %v", preBind, st)
		}
	}
}
