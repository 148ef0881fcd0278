// The reservations stream. No kube-scheduler phase calls it: NewWithClient starts it, a goroutine
// for the plugin's lifetime. It keeps the mirror (mirror.go) equal to the service's plans and
// reservations, so PreEnqueue, PreFilter, Filter, Score and Reserve answer from memory in the
// scheduling loop, and it moves members back to the active queue (the framework's Activate) when
// their group can go on: a new plan, a group no longer waiting for members, a reconnect.

package phalanx

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// maxStreamBackoff bounds the wait between two attempts to open the stream: serve is beside the
// scheduler (or behind its Service), a dial is cheap, and every second the stream is down after serve
// came up is a second no member is scheduled (at 5 s, a scheduler started before its serve left
// upstream's smallest scheduler_perf workloads waiting 6–36 s for a serve that had been up for seconds).
const maxStreamBackoff = time.Second

// watch keeps the reservations stream open for the plugin's lifetime (its own goroutine, started by
// NewWithClient): it reconnects with a backoff, and the mirror is empty while the stream is down.
func (p *Plugin) watch(ctx context.Context) {
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		err := p.watchOnce(ctx)
		p.mirror.Disconnect()
		if ctx.Err() != nil {
			return
		}
		p.logger.V(2).Info("phalanx: reservations stream ended; reconnecting", "err", err, "after", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxStreamBackoff)
	}
}

// watchOnce is one connection of the stream: each snapshot replaces the mirror; the first closes the
// breaker and retries every pending member, the later ones the members of groups that can make
// progress.
func (p *Plugin) watchOnce(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.client.WatchReservations(ctx, &pb.WatchReservationsRequest{Version: version})
	if err != nil {
		return err
	}
	first := true
	for {
		snap, err := stream.Recv()
		if err != nil {
			return err
		}
		progress := p.mirror.Apply(snap)
		p.rejectLeft(snap.GetRejectUids())
		if first {
			// serve answered: it is reachable, so a breaker the outage opened closes now instead of
			// refusing the members activated here until its cooldown ends
			p.breaker.Record(nil)
			p.activateAll()
			first = false
		} else if len(progress) > 0 {
			p.activate(progress, nil)
		}
	}
}

// leftMessage is what a member rejected by rejectLeft is told.
const leftMessage = "phalanx: the gang plan this member was reserved for was dropped before it completed; it is planned again"

// rejectLeft rejects, at whichever barrier each waits, the members a snapshot names as left: they
// were reserved for a gang plan the service dropped before it completed, so nothing will allow
// them, and kube-scheduler holds their nodes' capacity for them until they leave. (Their Unreserve
// tells the service, which leaves the group's current plan alone.) A member not waiting is skipped.
func (p *Plugin) rejectLeft(uids []string) {
	for _, uid := range uids {
		if p.release(types.UID(uid), decision{msg: leftMessage}) {
			p.logger.V(2).Info("phalanx: rejected a member left by a dropped gang plan", "pod", uid)
		}
	}
}

// activate (from the stream, and from planFor when a plan lands) moves the pending members of the
// groups (but those “skip“ names) back to the active queue. (The scheduler's pod informer has no
// namespace index: one pass over its pods.)
func (p *Plugin) activate(groups []string, skip func(types.UID) bool) {
	if p.pods == nil {
		return
	}
	want := sets.New(groups...)
	list, err := p.pods.List(labels.Everything())
	if err != nil {
		return
	}
	pods := map[string]*v1.Pod{}
	for _, pod := range list {
		if pod.Spec.NodeName == "" && want.Has(GroupOf(pod)) && (skip == nil || !skip(pod.UID)) {
			pods[pod.Namespace+"/"+pod.Name] = pod
		}
	}
	if len(pods) > 0 {
		p.handle.Activate(p.logger, pods)
	}
}

// activatePending moves those of the pods still pending (per the scheduler's informer) back to
// the active queue.
func (p *Plugin) activatePending(pods map[string]*v1.Pod) {
	if p.pods == nil {
		return
	}
	still := map[string]*v1.Pod{}
	for key, pod := range pods {
		if cur, err := p.pods.Pods(pod.Namespace).Get(pod.Name); err == nil && cur.UID == pod.UID && cur.Spec.NodeName == "" {
			still[key] = cur
		}
	}
	if len(still) > 0 {
		p.handle.Activate(p.logger, still)
	}
}

// activateAll retries every pending member after the stream (re)connects: what it missed while
// disconnected is in the first snapshot.
func (p *Plugin) activateAll() {
	if p.pods == nil {
		return
	}
	list, err := p.pods.List(labels.Everything())
	if err != nil {
		return
	}
	pods := map[string]*v1.Pod{}
	for _, pod := range list {
		if pod.Spec.NodeName == "" && GroupOf(pod) != "" {
			pods[pod.Namespace+"/"+pod.Name] = pod
		}
	}
	if len(pods) > 0 {
		p.handle.Activate(p.logger, pods)
	}
}
