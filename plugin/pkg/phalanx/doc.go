// Package phalanx is phalanx's kube-scheduler framework plugin: a thin enforcement, at the
// framework's extension points, of what `phalanx serve` decides (plans, group preemption,
// explanations stay in the service).
//
//   - PreEnqueue: a gang member whose group is missing members stays out of the active queue.
//   - PreFilter: a member's planned node, from the local mirror of the service's plans or one
//     PlanForPod call per group cycle, as the PreFilterResult: kube-scheduler's own filters check
//     exactly that node. The call runs beside the scheduling loop: a reply later than planWait
//     (a solve) answers the member "being planned", and the group's members are moved back to
//     the active queue when it lands. Plain pods: nothing to do unless some node holds reserved
//     capacity.
//   - Filter: plain pods are kept off capacity reserved for plans (from the mirror, no RPC).
//   - PostFilter: the planned node was rejected: which plugin, and why, goes to the service,
//     which re-slots or re-plans with that knowledge. Gang members get no per-pod preemption.
//   - Score: the planned node first; plain pods prefer nodes that hold no reservation.
//   - Reserve / Unreserve: the service's plan follows kube-scheduler's assumed pods (a member
//     assumed on its planned node is reserved from the mirror and reported with its Permit call).
//   - Permit: the gang barrier in process. A member waits (the framework's waiting pods; no
//     thread, no connection held) until the service says every planned member is reserved and the
//     placement record is written; then every waiting member is allowed. The Permit call runs
//     beside the scheduling loop (the member that completes the gang waits for the record
//     write, the loop does not). When one member's wait times out or fails, the rest are
//     rejected with it: a gang never binds partially.
//   - PreBind: the same barrier, later, for members that name a ResourceClaim (the shape of a
//     claim shared by the gang). kube-scheduler's DynamicResources plugin writes a claim's
//     allocation in the PreBind of the member that allocated it and, outside its own PodGroup
//     scheduling cycle, answers every other pod of that claim "in the process of being
//     allocated" until then; a Permit barrier would hold that first member before the write and
//     the rest could never reach it. Such members pass Permit and wait in PreBind (after
//     DynamicResources'; a binding goroutine each, never the scheduling loop) until the service
//     allows the gang; on timeout or rejection they fail PreBind and kube-scheduler unreserves
//     them (their entries in the claim's reservedFor removed).
//
// Failure modes: every RPC has a deadline and goes through a circuit breaker, so an unreachable
// service costs the scheduling loop at most one deadline per cooldown; members then wait
// (Unschedulable, retried), plain pods schedule as stock kube-scheduler would.
//
// One file per group of extension points, each with its test beside it: plugin.go (the plugin,
// its construction and what every phase shares; args.go its configuration), prefilter.go
// (PreEnqueue, the queueing hints, SignPod, PreFilter), filter.go (Filter, PostFilter, PreScore,
// Score), permit.go (Reserve, Unreserve, Permit), prebind.go (PreBind), stream.go and mirror.go
// (the reservations stream and the local copy it keeps), breaker.go (the circuit breaker).
package phalanx
