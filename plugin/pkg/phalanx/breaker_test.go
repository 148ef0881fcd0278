package phalanx

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

func statusErr() error { return status.Error(codes.Unavailable, "down") }

func TestUnreachableServiceMembersWaitPlainPodsScheduleAndTheBreakerStopsCalling(t *testing.T) {
	r := newRig(t, false) // nothing serves: every call fails
	for i := 0; i < 3; i++ {
		_, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), member("a", "g"), nil)
		if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "did not answer") {
			t.Fatalf("call %d: %v", i, st)
		}
	}
	if !r.plugin.breaker.Open() {
		t.Fatal("three failures in a row open the breaker")
	}
	start := time.Now()
	_, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), member("a", "g"), nil)
	if !strings.Contains(st.Message(), ErrOpen.Error()) {
		t.Fatalf("open breaker: %v", st)
	}
	if time.Since(start) >= r.plugin.args.PlanTimeout.Duration {
		t.Fatal("an open breaker must answer without waiting for a deadline")
	}
	if _, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), plain("p"), nil); st.Code() != fwk.Skip {
		t.Fatalf("plain pod: %v", st)
	}
	if st, _ := r.plugin.Permit(context.Background(), nil, member("a", "g"), "n1"); st.IsSuccess() || st.Code() == fwk.Wait {
		t.Fatalf("a member is never permitted without the service: %v", st)
	}
}

func TestBreakerHalfOpensAfterTheCooldownAndClosesOnSuccess(t *testing.T) {
	now := time.Unix(0, 0)
	b := &Breaker{Threshold: 2, Cooldown: time.Second, now: func() time.Time { return now }}
	for i := 0; i < 2; i++ {
		if b.Allow() != nil {
			t.Fatal("closed breaker refused")
		}
		b.Record(statusErr())
	}
	if b.Allow() != ErrOpen {
		t.Fatal("want open")
	}
	now = now.Add(2 * time.Second)
	if b.Allow() != nil {
		t.Fatal("half-open: one trial")
	}
	if b.Allow() != ErrOpen {
		t.Fatal("half-open: only one trial at a time")
	}
	b.Record(nil)
	if b.Open() || b.Allow() != nil {
		t.Fatal("success closes it")
	}
}

func TestBreakerCountsOnlyTransportFailuresInARow(t *testing.T) {
	now := time.Unix(0, 0)
	b := &Breaker{Threshold: 2, Cooldown: time.Second, now: func() time.Time { return now }}
	// an answer, even a refusal, means the service is reachable: it resets the count
	for _, err := range []error{statusErr(), status.Error(codes.FailedPrecondition, "no plan"), statusErr(),
		status.Error(codes.InvalidArgument, "bad contract version"), statusErr()} {
		if b.Allow() != nil {
			t.Fatalf("refused after %v", err)
		}
		b.Record(err)
	}
	if b.Open() {
		t.Fatal("transport failures separated by answers do not open it")
	}
	for _, code := range []codes.Code{codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted, codes.Unknown} {
		b := &Breaker{Threshold: 1, Cooldown: time.Second, now: func() time.Time { return now }}
		b.Record(status.Error(code, "x"))
		if !b.Open() {
			t.Fatalf("%v is a transport failure", code)
		}
	}
}

func TestBreakerFailedTrialOpensItForAnotherCooldown(t *testing.T) {
	now := time.Unix(0, 0)
	b := &Breaker{Threshold: 1, Cooldown: time.Second, now: func() time.Time { return now }}
	b.Record(statusErr())
	now = now.Add(time.Second)
	if b.Allow() != nil {
		t.Fatal("the cooldown is over: one trial")
	}
	if !b.Open() {
		t.Fatal("open while the trial is in flight")
	}
	b.Record(statusErr())
	now = now.Add(time.Second / 2)
	if b.Allow() != ErrOpen {
		t.Fatal("a failed trial opens it for another cooldown")
	}
	now = now.Add(time.Second / 2)
	if b.Allow() != nil {
		t.Fatal("the next trial after that cooldown")
	}
}

func TestTheStreamReconnectingClosesTheBreakerAndRetriesTheMembers(t *testing.T) {
	r := newRig(t, false) // serve not up yet: the scheduler started first
	for i := 0; i < 3; i++ {
		r.plugin.PreFilter(context.Background(), framework.NewCycleState(), member("a", "g"), nil)
	}
	if !r.plugin.breaker.Open() {
		t.Fatal("three failures in a row open the breaker")
	}
	go func() { _ = r.server.Serve(r.listener) }()        // serve comes up; the breaker's cooldown is an hour
	go func() { r.svc.snapshots <- &pb.Reservations{} }() // its first snapshot, as serve sends on connect
	deadline := time.Now().Add(5 * time.Second)
	for r.plugin.breaker.Open() {
		if time.Now().After(deadline) {
			t.Fatal("the stream reconnected to a reachable serve but the breaker stayed open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), member("a", "g"), nil)
	if st != nil && strings.Contains(st.Message(), ErrOpen.Error()) {
		t.Fatalf("PreFilter still refused by the breaker: %v", st)
	}
}
