// PreBindPreFlight and PreBind: the binding cycle, each pod in its own binding goroutine after the
// scheduling loop moved on. A gang member naming a ResourceClaim waits here instead of at Permit:
// DynamicResources writes the claim's allocation in the PreBind of the member that allocated it,
// and a Permit barrier would hold that member before the write (see the package documentation).

package phalanx

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// NamesClaim: the pod names a ResourceClaim directly (resourceClaimName), the shape of a claim
// its gang shares (phalanx's controller points every member at one PodGroup-owned claim). Claims
// from templates are each pod's own and need no later barrier.
func NamesClaim(pod *v1.Pod) bool {
	for _, c := range pod.Spec.ResourceClaims {
		if c.ResourceClaimName != nil && *c.ResourceClaimName != "" {
			return true
		}
	}
	return false
}

// waitsAtPreBind, asked by Permit, PreBindPreFlight and PreBind: the pod is a gang member whose
// barrier is PreBind, not Permit (it names a claim and the profile runs this plugin at PreBind
// after DynamicResources).
func (p *Plugin) waitsAtPreBind(pod *v1.Pod) bool {
	return GroupOf(pod) != "" && NamesClaim(pod) && p.barrierAtPreBind()
}

// barrierAtPreBind, decided at the first Permit or PreBind: the profile runs this plugin's PreBind
// after DynamicResources' (or without DynamicResources). Otherwise members naming a claim wait at
// Permit as the rest: a gang sharing a claim then cannot bind (said once in the log), but none
// binds without its barrier.
func (p *Plugin) barrierAtPreBind() bool {
	p.preBindOnce.Do(func() {
		lister, ok := p.handle.(interface{ ListPlugins() *config.Plugins })
		if !ok {
			return
		}
		dra, ours := -1, -1
		for i, plugin := range lister.ListPlugins().PreBind.Enabled {
			switch plugin.Name {
			case dynamicResources:
				dra = i
			case Name:
				ours = i
			}
		}
		p.preBind = ours >= 0 && dra < ours
		if !p.preBind {
			p.logger.Info("phalanx: the profile does not enable Phalanx at preBind after DynamicResources; " +
				"gang members naming a ResourceClaim wait at Permit, where a gang sharing one claim cannot complete")
		}
	})
	return p.preBind
}

// dynamicResources is the in-tree DRA plugin's name.
const dynamicResources = "DynamicResources"

// PreBindPreFlight: PreBind has work only for gang members naming a claim.
func (p *Plugin) PreBindPreFlight(_ context.Context, _ fwk.CycleState, pod *v1.Pod, _ string,
) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	if !p.waitsAtPreBind(pod) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return nil, nil
}

// PreBind is the gang barrier of a member naming a claim (see the package documentation): the
// member's Permit call, then, told to wait, a wait on its gate until the reply of the member that
// completes the gang allows it, a rejection reaches it, or permitTimeout passes. It runs in the
// member's binding goroutine, after the in-tree PreBind plugins wrote its claim's allocation.
func (p *Plugin) PreBind(ctx context.Context, _ fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	if !p.waitsAtPreBind(pod) {
		return nil
	}
	group := GroupOf(pod)
	gate := make(chan decision, 1)
	p.mu.Lock()
	p.atPreBind[pod.UID] = gate
	p.mu.Unlock()
	reply, err := p.callPermit(ctx, group, node, []string{string(pod.UID)}, map[string]string{string(pod.UID): node})
	if err != nil || reply.GetDecision() != pb.PermitReply_WAIT {
		// the completing member's reply may have allowed this one meanwhile: that decision stands
		if d := p.leavePreBind(pod.UID, gate); d.allow {
			return nil
		}
		switch {
		case err != nil:
			return p.unreachable(group, err)
		case reply.GetDecision() == pb.PermitReply_ALLOW:
			p.allowAll(reply.GetAllowUids(), pod.UID)
			return nil
		default:
			p.mirror.DropPlan(group)
			return fwk.NewStatus(fwk.Unschedulable, reply.GetReason())
		}
	}
	timer := time.NewTimer(p.args.PermitTimeout.Duration)
	defer timer.Stop()
	var d decision
	select {
	case d = <-gate:
	case <-timer.C:
		d = p.leavePreBind(pod.UID, gate)
		if d == (decision{}) {
			d.msg = fmt.Sprintf("phalanx: podgroup %s: the gang was not complete within %s", group, p.args.PermitTimeout.Duration)
		}
	case <-ctx.Done():
		if d = p.leavePreBind(pod.UID, gate); d == (decision{}) {
			d.msg = fmt.Sprintf("phalanx: podgroup %s: %v", group, ctx.Err())
		}
	}
	if d.allow {
		return nil
	}
	return fwk.NewStatus(fwk.Unschedulable, d.msg)
}

// leavePreBind, when PreBind stops waiting on its own (its call did not say wait, the timeout, the
// binding context ended), takes the member's gate out of the map; the decision already sent to it,
// if one was (the zero decision otherwise).
func (p *Plugin) leavePreBind(uid types.UID, gate chan decision) decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.atPreBind[uid] == gate {
		delete(p.atPreBind, uid)
		return decision{}
	}
	select {
	case d := <-gate:
		return d
	default:
		return decision{}
	}
}
