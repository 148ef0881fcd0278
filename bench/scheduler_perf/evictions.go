package schedulerperf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/test/utils/client-go/ktesting"
)

// evictionCount is what a workload's preemptions cost, written beside its results as
// <workload>.evictions.json: upstream's benchmark measures how fast preemptors are scheduled, not
// what they evict. Every scheduler is counted the same way, from the API server's watch: a victim
// is a pod that was bound and was deleted before the workload's last bind (upstream's workloads
// create every pod up front and delete none themselves; what goes after the last bind is the
// harness's cleanup). A victim group is a PodGroup (a pod's schedulingGroup) that lost a bound
// member; it went whole when every member it had bound was deleted.
type evictionCount struct {
	Workload      string `json:"workload"`
	EvictedPods   int    `json:"evicted_pods"`
	EvictedGroups int    `json:"evicted_groups"`
	PartialGroups int    `json:"partial_groups"` // victim groups left with some bound members running
	BoundPods     int    `json:"bound_pods"`     // pods bound at the last bind
}

type evictionWatch struct {
	mu       sync.Mutex
	bound    map[string]string          // pod key -> its group ("" for none), while bound
	members  map[string]map[string]bool // group -> its bound pods (true: deleted)
	deleted  []deletion
	lastBind time.Time
}

type deletion struct {
	at    time.Time
	group string
}

func groupOf(pod *v1.Pod) string {
	if pod.Spec.SchedulingGroup == nil || pod.Spec.SchedulingGroup.PodGroupName == nil {
		return ""
	}
	return pod.Namespace + "/" + *pod.Spec.SchedulingGroup.PodGroupName
}

func (w *evictionWatch) seen(pod *v1.Pod) {
	if pod.Spec.NodeName == "" {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.bound[key]; ok {
		return
	}
	group := groupOf(pod)
	w.bound[key] = group
	if group != "" {
		if w.members[group] == nil {
			w.members[group] = map[string]bool{}
		}
		w.members[group][key] = false
	}
	w.lastBind = time.Now()
}

func (w *evictionWatch) gone(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	w.mu.Lock()
	defer w.mu.Unlock()
	group, wasBound := w.bound[key]
	if !wasBound {
		return
	}
	delete(w.bound, key)
	if group != "" {
		w.members[group][key] = true
	}
	w.deleted = append(w.deleted, deletion{at: time.Now(), group: group})
}

// count: the victims deleted up to the last bind.
func (w *evictionWatch) count(name string) evictionCount {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := evictionCount{Workload: name, BoundPods: len(w.bound)}
	lost := map[string]int{}
	for _, d := range w.deleted {
		if d.at.After(w.lastBind) {
			continue
		}
		out.EvictedPods++
		if d.group != "" {
			lost[d.group]++
		}
	}
	for group, n := range lost {
		out.EvictedGroups++
		if n < len(w.members[group]) {
			out.PartialGroups++
		}
	}
	return out
}

// watchEvictions starts counting at the workload's start (from the prepare hook) and writes the
// count when the workload ends.
func watchEvictions(tCtx ktesting.TContext, logDir string) {
	w := &evictionWatch{bound: map[string]string{}, members: map[string]map[string]bool{}}
	factory := informers.NewSharedInformerFactory(tCtx.Client(), 0)
	pods := factory.Core().V1().Pods().Informer()
	_, _ = pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.seen(obj.(*v1.Pod)) },
		UpdateFunc: func(_, obj any) { w.seen(obj.(*v1.Pod)) },
		DeleteFunc: w.gone,
	})
	stop := make(chan struct{})
	factory.Start(stop)
	name := strings.ReplaceAll(tCtx.Name(), "/", "_")
	tCtx.Cleanup(func() {
		close(stop)
		if data, err := json.Marshal(w.count(tCtx.Name())); err == nil {
			_ = os.WriteFile(filepath.Join(logDir, name+".evictions.json"), data, 0o644)
		}
	})
}
