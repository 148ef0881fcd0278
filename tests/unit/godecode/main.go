// godecode decodes extender replies with Go's encoding/json into kube-scheduler's own
// extender types (k8s.io/kube-scheduler/extender/v1), exactly as kube-scheduler does.
// Input on stdin: one JSON object per line {"type": "...", "body": <reply>}.
// Output: one line per input, "ok" or "error: ...".
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

type request struct {
	Type string          `json:"type"`
	Body json.RawMessage `json:"body"`
}

func decode(kind string, body []byte) error {
	var target interface{}
	switch kind {
	case "filter":
		target = &extenderv1.ExtenderFilterResult{}
	case "prioritize":
		target = &extenderv1.HostPriorityList{}
	case "bind":
		target = &extenderv1.ExtenderBindingResult{}
	case "preempt":
		target = &extenderv1.ExtenderPreemptionResult{}
	default:
		return fmt.Errorf("unknown type %q", kind)
	}
	if err := json.Unmarshal(body, target); err != nil {
		return err
	}
	out, err := json.Marshal(target)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s\n", out)
	return nil
}

func main() {
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 256<<20)
	for scanner.Scan() {
		var req request
		if err := json.Unmarshal(scanner.Bytes(), &req); err != nil {
			fmt.Printf("error: bad input line: %v\n", err)
			continue
		}
		if err := decode(req.Type, req.Body); err != nil {
			fmt.Printf("error: %v\n", err)
		} else {
			fmt.Println("ok")
		}
	}
}
