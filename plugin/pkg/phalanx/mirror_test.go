package phalanx

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

func gangPlan(group string, id uint64, state string, assignments map[string]string) *pb.GroupPlan {
	return &pb.GroupPlan{Group: group, Id: id, State: state, Gang: true, Assignments: assignments}
}

func plannedNode(t *testing.T, m *Mirror, uid, want string) {
	t.Helper()
	node, ok := m.PlannedNode(types.UID(uid))
	if want == "" && ok {
		t.Fatalf("%s: planned on %s, want no open plan", uid, node)
	}
	if want != "" && (!ok || node != want) {
		t.Fatalf("%s: planned on %q (%v), want %s", uid, node, ok, want)
	}
}

func wantProgress(t *testing.T, got []string, want ...string) {
	t.Helper()
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("progress %v, want %v", got, want)
	}
}

func TestMirrorApplyIndexesPlansByMemberAndReportsNewOrChangedPlansAsProgress(t *testing.T) {
	m := NewMirror()
	if m.Synced() || m.HasReservations() {
		t.Fatal("a new mirror is empty and not synced")
	}
	plannedNode(t, m, "uid-a", "")
	wantProgress(t, m.Apply(&pb.Reservations{Version: 1, Plans: []*pb.GroupPlan{
		gangPlan("ns/g", 1, "planned", map[string]string{"uid-a": "n1", "uid-b": "n2"})}}), "ns/g")
	if !m.Synced() || m.Plan("ns/g").GetId() != 1 {
		t.Fatalf("after the first snapshot: synced %v, plan %v", m.Synced(), m.Plan("ns/g"))
	}
	plannedNode(t, m, "uid-a", "n1")
	plannedNode(t, m, "uid-b", "n2")
	// the same plan again (a snapshot for another group's change) is no progress
	wantProgress(t, m.Apply(&pb.Reservations{Version: 2, Plans: []*pb.GroupPlan{
		gangPlan("ns/g", 1, "planned", map[string]string{"uid-a": "n1", "uid-b": "n2"})}}))
	// a re-plan (new id) is progress; a member the new plan leaves out is no longer planned
	wantProgress(t, m.Apply(&pb.Reservations{Version: 3, Plans: []*pb.GroupPlan{
		gangPlan("ns/g", 2, "planned", map[string]string{"uid-a": "n3"})}}), "ns/g")
	plannedNode(t, m, "uid-a", "n3")
	plannedNode(t, m, "uid-b", "")
	// a plan that disappears (released, or bound and forgotten) is no progress, and is forgotten
	wantProgress(t, m.Apply(&pb.Reservations{Version: 4}))
	plannedNode(t, m, "uid-a", "")
	if m.Plan("ns/g") != nil {
		t.Fatalf("a plan the snapshot no longer lists: %v", m.Plan("ns/g"))
	}
}

func TestMirrorPlannedNodeOnlyWhileThePlanIsOpenForTheMember(t *testing.T) {
	for _, c := range []struct {
		state string
		gang  bool
		open  bool
	}{
		{"planned", true, true},
		{"planned", false, true},
		{"binding", true, false}, // a gang binds through the barrier, not PreFilter
		{"binding", false, true}, // a Basic group's members bind one by one on the same plan
		{"bound", false, false},
		{"expired", true, false},
	} {
		m := NewMirror()
		m.Apply(&pb.Reservations{Plans: []*pb.GroupPlan{{Group: "ns/g", Id: 1, State: c.state, Gang: c.gang,
			Assignments: map[string]string{"uid-a": "n1"}}}})
		_, ok := m.PlannedNode("uid-a")
		if ok != c.open {
			t.Fatalf("state %s, gang %v: open %v, want %v", c.state, c.gang, ok, c.open)
		}
		plannedNode(t, m, "uid-other", "")
	}
}

func TestMirrorHoldsEachSnapshotsCapacityPerNodeAndNothingElse(t *testing.T) {
	m := NewMirror()
	m.Apply(&pb.Reservations{Version: 1, Nodes: map[string]*pb.NodeReservation{
		"n1": {Amounts: map[string]int64{"cpu": 2000, "nvidia.com/gpu": 2, "pods": 2}},
		"n2": {Amounts: map[string]int64{"memory": 1 << 30}},
	}})
	if !m.HasReservations() {
		t.Fatal("two nodes hold capacity")
	}
	if got := m.Reserved("n1"); got["cpu"] != 2000 || got["nvidia.com/gpu"] != 2 || got["pods"] != 2 || len(got) != 3 {
		t.Fatalf("n1 holds %v", got)
	}
	if got := m.Reserved("n2"); got["memory"] != 1<<30 || len(got) != 1 {
		t.Fatalf("n2 holds %v", got)
	}
	if got := m.Reserved("n3"); got != nil {
		t.Fatalf("a node the snapshot does not name holds %v", got)
	}
	// the next snapshot replaces the held capacity; it does not add to it
	m.Apply(&pb.Reservations{Version: 2, Nodes: map[string]*pb.NodeReservation{
		"n2": {Amounts: map[string]int64{"cpu": 500}}}})
	if got := m.Reserved("n1"); got != nil {
		t.Fatalf("n1 after a snapshot without it: %v", got)
	}
	if got := m.Reserved("n2"); got["cpu"] != 500 || len(got) != 1 {
		t.Fatalf("n2 after the second snapshot: %v", got)
	}
	m.Apply(&pb.Reservations{Version: 3})
	if m.HasReservations() {
		t.Fatal("a snapshot without nodes holds nothing")
	}
}

func TestMirrorReportsAGroupNoLongerWaitingForMembersOnceAsProgress(t *testing.T) {
	m := NewMirror()
	wantProgress(t, m.Apply(&pb.Reservations{Version: 1, WaitingGroups: []string{"ns/g", "ns/h", "ns/k"}}))
	for _, g := range []string{"ns/g", "ns/h", "ns/k"} {
		if !m.Waiting(g) {
			t.Fatalf("%s is waiting", g)
		}
	}
	if m.Waiting("ns/other") {
		t.Fatal("a group the snapshot does not list is not waiting")
	}
	// g completes without a plan yet; h completes and is planned in the same snapshot (one report,
	// not two); k still waits
	wantProgress(t, m.Apply(&pb.Reservations{Version: 2, WaitingGroups: []string{"ns/k"}, Plans: []*pb.GroupPlan{
		gangPlan("ns/h", 1, "planned", map[string]string{"uid-h": "n1"})}}), "ns/g", "ns/h")
	if m.Waiting("ns/g") || m.Waiting("ns/h") || !m.Waiting("ns/k") {
		t.Fatal("waiting groups are the snapshot's")
	}
	// the service answered a member of k "members missing": k completing is reported once
	m.MembersMissing("ns/k")
	wantProgress(t, m.Apply(&pb.Reservations{Version: 3}), "ns/k")
	wantProgress(t, m.Apply(&pb.Reservations{Version: 4}))
}

func TestMirrorPutPlanAndDropPlanBetweenSnapshots(t *testing.T) {
	m := NewMirror()
	m.PutPlan(nil)
	m.PutPlan(&pb.GroupPlan{Id: 1, State: "planned", Assignments: map[string]string{"uid-a": "n1"}})
	plannedNode(t, m, "uid-a", "") // a reply without a plan, or a plan without a group, is ignored
	m.PutPlan(gangPlan("ns/g", 1, "planned", map[string]string{"uid-a": "n1", "uid-b": "n2"}))
	plannedNode(t, m, "uid-a", "n1")
	plannedNode(t, m, "uid-b", "n2")
	// a newer plan of the group replaces the old one, members it leaves out included
	m.PutPlan(gangPlan("ns/g", 2, "planned", map[string]string{"uid-a": "n3"}))
	plannedNode(t, m, "uid-a", "n3")
	plannedNode(t, m, "uid-b", "")
	// a member another group's plan took over stays planned there when the first group's plan goes
	m.PutPlan(gangPlan("ns/g", 3, "planned", map[string]string{"uid-a": "n1", "uid-c": "n2"}))
	m.PutPlan(gangPlan("ns/h", 1, "planned", map[string]string{"uid-c": "n4"}))
	m.DropPlan("ns/g")
	plannedNode(t, m, "uid-a", "")
	plannedNode(t, m, "uid-c", "n4")
	if m.Plan("ns/g") != nil || m.Plan("ns/h").GetId() != 1 {
		t.Fatalf("plans after the drop: g %v, h %v", m.Plan("ns/g"), m.Plan("ns/h"))
	}
	m.DropPlan("ns/unknown") // nothing to forget
	plannedNode(t, m, "uid-c", "n4")
	// a plan put between snapshots is progress when the stream brings it (the stream is the record)
	wantProgress(t, m.Apply(&pb.Reservations{Version: 1, Plans: []*pb.GroupPlan{
		gangPlan("ns/h", 1, "planned", map[string]string{"uid-c": "n4"})}}))
}

func TestMirrorDisconnectForgetsEverythingUntilTheNextSnapshot(t *testing.T) {
	m := NewMirror()
	snap := &pb.Reservations{Version: 1, WaitingGroups: []string{"ns/w"},
		Plans: []*pb.GroupPlan{gangPlan("ns/g", 1, "planned", map[string]string{"uid-a": "n1"})},
		Nodes: map[string]*pb.NodeReservation{"n1": {Amounts: map[string]int64{"cpu": 1000}}}}
	m.Apply(snap)
	m.Disconnect()
	if m.Synced() || m.HasReservations() || m.Reserved("n1") != nil || m.Waiting("ns/w") || m.Plan("ns/g") != nil {
		t.Fatal("a disconnected mirror knows nothing: plain pods schedule as stock, members ask the service")
	}
	plannedNode(t, m, "uid-a", "")
	// on reconnect the first snapshot brings every plan back, each as progress
	wantProgress(t, m.Apply(snap), "ns/g")
	plannedNode(t, m, "uid-a", "n1")
	if !m.Synced() || !m.Waiting("ns/w") || m.Reserved("n1")["cpu"] != 1000 {
		t.Fatal("the first snapshot after a reconnect restores the mirror")
	}
}

// The scheduling loop reads the mirror while the stream and PlanForPod replies write it.
func TestMirrorReadsWhileSnapshotsAndPlansAreWritten(t *testing.T) {
	m := NewMirror()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < 500; i++ {
			node := fmt.Sprintf("n%d", i)
			m.Apply(&pb.Reservations{Version: uint64(i), Plans: []*pb.GroupPlan{
				gangPlan("ns/g", uint64(i), "planned", map[string]string{"uid-a": node})},
				Nodes: map[string]*pb.NodeReservation{node: {Amounts: map[string]int64{"cpu": 1}}}})
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 500; i++ {
			m.PutPlan(gangPlan("ns/h", uint64(i), "planned", map[string]string{"uid-b": "n1"}))
			m.DropPlan("ns/h")
		}
	}()
	for i := 0; i < 500; i++ {
		m.PlannedNode("uid-a")
		m.PlannedNode("uid-b")
		m.Reserved(fmt.Sprintf("n%d", i))
		m.HasReservations()
	}
	wg.Wait()
	plannedNode(t, m, "uid-a", "n499")
	plannedNode(t, m, "uid-b", "")
}

func TestMirrorOffersAMembersClassmatesNodesForATradeUntilTheyAreTaken(t *testing.T) {
	m := NewMirror()
	plan := gangPlan("ns/g", 1, "planned", map[string]string{"a": "n1", "b": "n2", "c": "n3", "d": "n3", "e": "n4", "f": "n5"})
	plan.TradeClasses = map[string]uint32{"a": 0, "b": 0, "c": 0, "d": 0, "f": 1}
	plan.Reserved = []string{"b"}
	m.Apply(&pb.Reservations{Plans: []*pb.GroupPlan{plan}})
	alternatives := func(uid string, want map[string]types.UID) {
		t.Helper()
		got := m.Alternatives(types.UID(uid))
		if len(got) != len(want) {
			t.Fatalf("%s: alternatives %v, want %v", uid, got, want)
		}
		for node, partner := range want {
			if got[node] != partner {
				t.Fatalf("%s: alternatives %v, want %v", uid, got, want)
			}
		}
	}
	// b is reserved (the service says so); of c and d on n3, the smaller uid; e has no class, f is
	// alone in its own
	alternatives("a", map[string]types.UID{"n3": "c"})
	alternatives("e", nil)
	alternatives("f", nil)
	m.Take("c") // kube-scheduler reserved c in this process (the service may not know yet)
	alternatives("a", map[string]types.UID{"n3": "d"})
	m.Take("d")
	alternatives("a", nil)
	m.Release("d")
	alternatives("a", map[string]types.UID{"n3": "d"})
	m.Trade("a", "d", "n3")
	plannedNode(t, m, "a", "n3")
	plannedNode(t, m, "d", "n1")
	m.Trade("a", "d", "n3") // the stream brought the trade first: nothing changes
	plannedNode(t, m, "a", "n3")
	plannedNode(t, m, "d", "n1")
	// a member the plan no longer lists is forgotten as taken; a plan not planned offers nothing
	binding := gangPlan("ns/g", 1, "binding", map[string]string{"a": "n3", "b": "n2", "d": "n1"})
	binding.TradeClasses = map[string]uint32{"a": 0, "b": 0, "d": 0}
	m.Apply(&pb.Reservations{Plans: []*pb.GroupPlan{binding}})
	if _, kept := m.taken["c"]; kept {
		t.Fatalf("c is still marked taken after its plan dropped it")
	}
	alternatives("a", nil)
}
