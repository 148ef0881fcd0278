// The mirror, phalanx serve's plans and reservations held in the plugin's memory. The reservations
// stream (stream.go) replaces it with each snapshot, and PlanForPod replies (PreFilter) add a plan
// between two. It is read in the scheduling loop, where an RPC per pod or per node would cost too
// much: PreEnqueue (Waiting), PreFilter and Reserve (PlannedNode), Filter and Score (Reserved),
// SignPod, PreFilter and PreScore (HasReservations); PreEnqueue and PreFilter also read whether a
// group waits for its preemption's victims (Preempting), PreEnqueue and the queueing hint whether
// the service has still to try planning it ahead (HoldUntried). Reserve, Permit, PreBind and PostFilter drop a
// plan the service no longer holds (DropPlan).

package phalanx

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// Mirror is the plugin's local copy of what phalanx serve holds: every plan (so members are
// answered without an RPC), the capacity those plans reserve per node (so plain pods are kept
// off it without an RPC per node), the gang groups still waiting for members and those waiting for
// their preemption's victims to terminate (PreEnqueue).
// WatchReservations replaces it with each snapshot; PlanForPod replies add a plan in between.
type Mirror struct {
	mu      sync.RWMutex
	synced  bool
	version uint64
	plans   map[string]*pb.GroupPlan // group -> plan
	byUID   map[types.UID]string     // planned member -> group
	nodes   map[string]map[string]int64
	waiting map[string]bool
	// groups whose preemption's victims have not all terminated: nothing of theirs fits before
	preempting map[string]bool
	// groups the service has still to try planning ahead, and those of them whose members this
	// plugin kept out of the queue (moved back when the group leaves the list)
	untried, heldUntried map[string]bool
	missing              map[string]bool // groups the service answered "members missing", until complete
	// members kube-scheduler reserved in this process (a pod-group cycle's simulation too, which
	// the service is not told of): their planned nodes are not offered to others for a trade
	taken map[types.UID]bool
}

// MaxTradeNodes bounds the nodes PreFilter offers a member beside its own (see Alternatives): the
// filters kube-scheduler runs on each of them are the price of a trade.
const MaxTradeNodes = 64

// NewMirror returns an empty, unsynced mirror.
func NewMirror() *Mirror {
	return &Mirror{plans: map[string]*pb.GroupPlan{}, byUID: map[types.UID]string{},
		nodes: map[string]map[string]int64{}, waiting: map[string]bool{}, preempting: map[string]bool{},
		untried: map[string]bool{}, heldUntried: map[string]bool{}, missing: map[string]bool{},
		taken: map[types.UID]bool{}}
}

// MembersMissing (when a PlanForPod reply lands, see planFor) notes that the service answered a
// member of the group "members missing": once a snapshot no longer lists the group as waiting,
// Apply reports it as progress.
func (m *Mirror) MembersMissing(group string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.missing[group] = true
}

// Apply, for each snapshot on the reservations stream, replaces the mirror with it. It returns the
// groups that can make progress now — a plan that is new (or changed), a group no longer waiting
// for members or for its preemption's victims, a group held untried that is no longer listed —
// so the caller can move their pods back to the active queue.
func (m *Mirror) Apply(snap *pb.Reservations) []string {
	plans := make(map[string]*pb.GroupPlan, len(snap.GetPlans()))
	byUID := map[types.UID]string{}
	for _, plan := range snap.GetPlans() {
		plans[plan.GetGroup()] = plan
		for uid := range plan.GetAssignments() {
			byUID[types.UID(uid)] = plan.GetGroup()
		}
	}
	nodes := make(map[string]map[string]int64, len(snap.GetNodes()))
	for node, held := range snap.GetNodes() {
		nodes[node] = held.GetAmounts()
	}
	waiting := make(map[string]bool, len(snap.GetWaitingGroups()))
	for _, g := range snap.GetWaitingGroups() {
		waiting[g] = true
	}
	preempting := make(map[string]bool, len(snap.GetPreemptingGroups()))
	for _, g := range snap.GetPreemptingGroups() {
		preempting[g] = true
	}
	untried := make(map[string]bool, len(snap.GetUntriedGroups()))
	for _, g := range snap.GetUntriedGroups() {
		untried[g] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var progress []string
	for group, plan := range plans {
		old := m.plans[group]
		if old == nil || old.GetId() != plan.GetId() {
			progress = append(progress, group)
		}
	}
	for group := range m.waiting {
		if !waiting[group] && plans[group] == nil && !m.missing[group] {
			progress = append(progress, group)
		}
	}
	for group := range m.preempting {
		if preempting[group] || plans[group] != nil {
			continue
		}
		if untried[group] {
			m.heldUntried[group] = true // its victims gone, planned ahead next: held until then
			continue
		}
		progress = append(progress, group)
	}
	for group := range m.heldUntried {
		if untried[group] {
			continue
		}
		delete(m.heldUntried, group)
		if plans[group] == nil && !preempting[group] && !waiting[group] {
			progress = append(progress, group) // tried without a plan: its members ask as before
		}
	}
	for group := range m.missing {
		if !waiting[group] {
			progress = append(progress, group)
			delete(m.missing, group)
		}
	}
	m.synced, m.version = true, snap.GetVersion()
	m.plans, m.byUID, m.nodes, m.waiting, m.preempting = plans, byUID, nodes, waiting, preempting
	m.untried = untried
	for uid := range m.taken {
		if _, planned := byUID[uid]; !planned {
			delete(m.taken, uid)
		}
	}
	return progress
}

// Disconnect, when the reservations stream ends, forgets everything: while the stream is down
// nothing reserved is known, so plain pods schedule as stock kube-scheduler would, and members ask
// the service (and wait when it is unreachable).
func (m *Mirror) Disconnect() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.synced = false
	m.plans, m.byUID = map[string]*pb.GroupPlan{}, map[types.UID]string{}
	m.nodes, m.waiting, m.preempting = map[string]map[string]int64{}, map[string]bool{}, map[string]bool{}
	m.untried, m.heldUntried = map[string]bool{}, map[string]bool{}
}

// PutPlan records a plan a PlanForPod reply carried, when planFor's call lands (the stream brings
// it too, later).
func (m *Mirror) PutPlan(plan *pb.GroupPlan) {
	if plan == nil || plan.GetGroup() == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropLocked(plan.GetGroup())
	m.plans[plan.GetGroup()] = plan
	for uid := range plan.GetAssignments() {
		m.byUID[types.UID(uid)] = plan.GetGroup()
	}
}

// DropPlan forgets a group's plan (the service released it, or will re-plan it): Reserve, Permit,
// PreBind call it when the service refused the member, PostFilter when its planned node failed.
func (m *Mirror) DropPlan(group string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropLocked(group)
}

func (m *Mirror) dropLocked(group string) {
	if old := m.plans[group]; old != nil {
		for uid := range old.GetAssignments() {
			if m.byUID[types.UID(uid)] == group {
				delete(m.byUID, types.UID(uid))
			}
		}
		delete(m.plans, group)
	}
}

// PlannedNode, asked by PreFilter and Reserve, is the member's node in a plan still open for it
// (planned; a Basic group's plan stays open while its members bind one by one).
func (m *Mirror) PlannedNode(uid types.UID) (string, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	group, ok := m.byUID[uid]
	if !ok {
		return "", false
	}
	plan := m.plans[group]
	if plan.GetState() != "planned" && (plan.GetGang() || plan.GetState() != "binding") {
		return "", false
	}
	node, ok := plan.GetAssignments()[string(uid)]
	return node, ok
}

// Alternatives, asked by PreFilter for a member whose plan lists it in a trade class, are the
// planned nodes of the other members of its class that kube-scheduler has not reserved, other than
// its own: node -> the member planned there (the smallest uid when several are). At most
// MaxTradeNodes; nil when the member has no class.
func (m *Mirror) Alternatives(uid types.UID) map[string]types.UID {
	m.mu.RLock()
	defer m.mu.RUnlock()
	plan := m.plans[m.byUID[uid]]
	class, ok := plan.GetTradeClasses()[string(uid)]
	if !ok || plan.GetState() != "planned" {
		return nil
	}
	own := plan.GetAssignments()[string(uid)]
	reserved := sets.New(plan.GetReserved()...)
	out := map[string]types.UID{}
	for other, c := range plan.GetTradeClasses() {
		node := plan.GetAssignments()[other]
		if c != class || other == string(uid) || node == "" || node == own || reserved.Has(other) ||
			m.taken[types.UID(other)] {
			continue
		}
		if held, seen := out[node]; seen {
			if types.UID(other) < held {
				out[node] = types.UID(other)
			}
			continue
		}
		if len(out) < MaxTradeNodes {
			out[node] = types.UID(other)
		}
	}
	return out
}

// Trade records a trade the service accepted at Reserve: uid now holds node, partner uid's old
// node. Nothing changes when uid holds node already (a snapshot brought the trade first) or the
// partner no longer holds it.
func (m *Mirror) Trade(uid, partner types.UID, node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	plan := m.plans[m.byUID[uid]]
	if plan == nil || m.byUID[partner] != plan.GetGroup() {
		return
	}
	assignments := plan.GetAssignments()
	if assignments[string(uid)] == node || assignments[string(partner)] != node {
		return
	}
	assignments[string(uid)], assignments[string(partner)] = node, assignments[string(uid)]
}

// Take and Release mark a member reserved by kube-scheduler in this process (Reserve) and no longer
// (Unreserve): a member taken is not offered for a trade.
func (m *Mirror) Take(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.taken[uid] = true
}

// Release: see Take.
func (m *Mirror) Release(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.taken, uid)
}

// Plan is the group's plan as mirrored (nil when none). No phase reads it: it shows what the
// mirror holds.
func (m *Mirror) Plan(group string) *pb.GroupPlan {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.plans[group]
}

// Reserved is what plans hold on the node (nil when nothing), per resource in the contract's units
// (cpu in millicores, others in base units): Filter and Score read it for each node.
func (m *Mirror) Reserved(node string) map[string]int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.nodes[node]
}

// HasReservations reports whether any node holds capacity for a plan: while none does, SignPod,
// PreFilter and PreScore leave plain pods to the stock plugins.
func (m *Mirror) HasReservations() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.nodes) > 0
}

// Waiting reports whether the gang group has fewer members than its minCount (PreEnqueue).
func (m *Mirror) Waiting(group string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.waiting[group]
}

// Preempting reports whether the group waits for the pods its preemption evicted to terminate
// (PreEnqueue keeps its members out of the queue, PreFilter answers them without a call).
func (m *Mirror) Preempting(group string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.preempting[group]
}

// HoldUntried reports whether the service has still to try planning the group ahead (and the
// mirror holds no plan for it): PreEnqueue then keeps the member out of the queue, and the queueing
// hint skips it. The group is noted as held, so that the snapshot no longer listing it moves its
// members back (Apply) when it brought no plan.
func (m *Mirror) HoldUntried(group string) bool {
	m.mu.RLock()
	listed := m.untried[group] && m.plans[group] == nil
	m.mu.RUnlock()
	if !listed { // the common case, read-locked: the queueing hint asks for every pending pod
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.untried[group] || m.plans[group] != nil {
		return false
	}
	m.heldUntried[group] = true
	return true
}

// Synced reports whether a snapshot arrived since the stream (re)connected (benchmarks wait for
// it).
func (m *Mirror) Synced() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.synced
}
