package phalanx

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// benchInput is what `phalanx bench plugin` hands the driver: the gangs it created in its
// simulated cluster (each a list of member pods, as stored there), a plain pod and the nodes.
type benchInput struct {
	Groups [][]*v1.Pod `json:"groups"`
	Plain  *v1.Pod     `json:"plain"`
	Nodes  []*v1.Node  `json:"nodes"`
}

// TestPluginPathAgainstService drives the plugin's extension points as kube-scheduler would,
// against a running `phalanx serve` (PHALANX_BENCH_ADDR, its gRPC address) on a simulated
// cluster, and prints the latency of each (p50 and p99, ms) as one JSON line. It is the plugin
// path's counterpart of `phalanx bench extender`, run by `phalanx bench plugin`; skipped otherwise.
// Per gang: every member's PreFilter (the first one's asks the service: PlanForPod, which may
// run the workload cycle; past planWait it is answered "being planned" and taken again once the
// plan is on the stream, as the group's activation does), Reserve on the planned node and Permit;
// the barrier's release is the time from the last member's Permit until every member is allowed
// (the service writes the placement record first). Then, while one more gang is planned (its nodes
// hold reserved capacity), a plain pod's PreFilter and its Filter on every node.
func TestPluginPathAgainstService(t *testing.T) {
	addr, inputPath := os.Getenv("PHALANX_BENCH_ADDR"), os.Getenv("PHALANX_BENCH_INPUT")
	if addr == "" || inputPath == "" {
		t.Skip("run by `phalanx bench plugin` (PHALANX_BENCH_ADDR, PHALANX_BENCH_INPUT)")
	}
	raw, err := os.ReadFile(inputPath)
	if err != nil {
		t.Fatal(err)
	}
	var input benchInput
	if err := json.Unmarshal(raw, &input); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	args, err := Args{Address: addr}.Defaulted()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &fakeHandle{waiting: map[types.UID]*fakeWaitingPod{}, preBind: shippedPreBind}
	p := NewWithClient(ctx, args, h, nil, pb.NewSchedulerPluginClient(conn))
	defer p.Wait()
	defer cancel()
	waitFor(t, "the first reservations snapshot", func() bool { return p.Mirror().Synced() })

	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
	timings := map[string][]float64{}
	if len(input.Groups) < 2 {
		t.Fatal("the input needs gangs to place and one more to hold")
	}
	gangs, held := input.Groups[:len(input.Groups)-1], input.Groups[len(input.Groups)-1]
	for _, members := range gangs {
		for i, pod := range members {
			started := time.Now()
			res, st := p.PreFilter(ctx, framework.NewCycleState(), pod, nil)
			if i == 0 {
				timings["PreFilter, first member (PlanForPod)"] = append(timings["PreFilter, first member (PlanForPod)"], ms(time.Since(started)))
				if !st.IsSuccess() && strings.Contains(st.Message(), "being planned") {
					waitFor(t, "the plan on the stream", func() bool { _, ok := p.Mirror().PlannedNode(pod.UID); return ok })
					timings["plan ready, first member"] = append(timings["plan ready, first member"], ms(time.Since(started)))
					started = time.Now()
					res, st = p.PreFilter(ctx, framework.NewCycleState(), pod, nil)
				}
			} else {
				timings["PreFilter, planned member"] = append(timings["PreFilter, planned member"], ms(time.Since(started)))
			}
			if !st.IsSuccess() || res == nil || res.NodeNames.Len() != 1 {
				t.Fatalf("%s: PreFilter %v %v", pod.Name, res, st)
			}
			node := res.NodeNames.UnsortedList()[0]
			started = time.Now()
			if st := p.Reserve(ctx, nil, pod, node); !st.IsSuccess() {
				t.Fatalf("%s: Reserve %v", pod.Name, st)
			}
			timings["Reserve"] = append(timings["Reserve"], ms(time.Since(started)))
			started = time.Now()
			if st, _ := p.Permit(ctx, nil, pod, node); st.Code() != fwk.Wait {
				t.Fatalf("%s: Permit %v", pod.Name, st)
			}
			timings["Permit (returns Wait)"] = append(timings["Permit (returns Wait)"], ms(time.Since(started)))
			h.wait(pod)
		}
		last := time.Now()
		waitFor(t, "every member allowed", func() bool {
			for _, pod := range members {
				if w := h.GetWaitingPod(pod.UID); w == nil || len(w.(*fakeWaitingPod).Allowed()) == 0 {
					return false
				}
			}
			return true
		})
		timings["barrier release, last Permit to all allowed"] = append(timings["barrier release, last Permit to all allowed"], ms(time.Since(last)))
	}

	// the last gang is only planned: its nodes hold reserved capacity while the plain pod is filtered
	if _, st := p.PreFilter(ctx, framework.NewCycleState(), held[0], nil); !st.IsSuccess() && !strings.Contains(st.Message(), "being planned") {
		t.Fatalf("the held gang: %v", st)
	}
	waitFor(t, "the held gang's reservations on the stream", p.Mirror().HasReservations)
	infos := make([]fwk.NodeInfo, 0, len(input.Nodes))
	for _, node := range input.Nodes {
		ni := framework.NewNodeInfo()
		ni.SetNode(node)
		infos = append(infos, ni)
	}
	for k := 0; k < 20; k++ {
		state := framework.NewCycleState()
		started := time.Now()
		_, st := p.PreFilter(ctx, state, input.Plain, nil)
		timings["PreFilter, plain pod"] = append(timings["PreFilter, plain pod"], ms(time.Since(started)))
		if st.Code() == fwk.Skip {
			t.Fatal("no node holds a reservation: the plain pod's Filter is not exercised")
		}
		for _, ni := range infos {
			started = time.Now()
			p.Filter(ctx, state, input.Plain, ni)
			timings["Filter, plain pod, one node"] = append(timings["Filter, plain pod, one node"], ms(time.Since(started)))
		}
	}

	out := map[string]map[string]float64{}
	for kind, values := range timings {
		sort.Float64s(values)
		pct := func(q float64) float64 { return values[int(q*float64(len(values)-1)+0.5)] }
		out[kind] = map[string]float64{"p50_ms": pct(0.50), "p99_ms": pct(0.99), "n": float64(len(values))}
	}
	line, _ := json.Marshal(out)
	fmt.Printf("PHALANX_BENCH_RESULT %s\n", line)
}
