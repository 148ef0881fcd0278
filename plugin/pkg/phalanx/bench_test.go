package phalanx

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// A mirror as at 10,000 nodes: every node holds a reservation, one plan of 1,000 members.
func bigMirrorRig(b *testing.B) *rig {
	r := newRig(b, true)
	snap := &pb.Reservations{Version: 1, Nodes: map[string]*pb.NodeReservation{}}
	plan := &pb.GroupPlan{Group: "ns/g", Id: 1, State: "planned", Gang: true, Assignments: map[string]string{}}
	for i := 0; i < 10000; i++ {
		snap.Nodes[fmt.Sprintf("n%05d", i)] = &pb.NodeReservation{Amounts: map[string]int64{"cpu": 1000, "pods": 1}}
	}
	for i := 0; i < 1000; i++ {
		plan.Assignments[fmt.Sprintf("uid-m%d", i)] = fmt.Sprintf("n%05d", i)
	}
	snap.Plans = []*pb.GroupPlan{plan}
	r.plugin.Mirror().Apply(snap)
	return r
}

// BenchmarkPreFilterPlannedMember: a planned member's PreFilter, answered from the mirror.
func BenchmarkPreFilterPlannedMember(b *testing.B) {
	r := bigMirrorRig(b)
	pod := member("m500", "g")
	pod.UID = types.UID("uid-m500")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, st := r.plugin.PreFilter(context.Background(), framework.NewCycleState(), pod, nil); !st.IsSuccess() {
			b.Fatal(st)
		}
	}
}

// BenchmarkFilterPlainPodOnAReservedNode: a plain pod's Filter on a node holding a reservation.
func BenchmarkFilterPlainPodOnAReservedNode(b *testing.B) {
	r := bigMirrorRig(b)
	state := framework.NewCycleState()
	if _, st := r.plugin.PreFilter(context.Background(), state, plain("p"), nil); !st.IsSuccess() {
		b.Fatal(st)
	}
	ni := nodeInfo("n00042", 4)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.plugin.Filter(context.Background(), state, plain("p"), ni)
	}
}
