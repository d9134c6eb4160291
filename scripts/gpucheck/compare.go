// Command gpucheck checks a node's GPU facts, as the control plane holds them
// (`mercator node get NODE -o json`), against `nvidia-smi -q -x` on the
// same machine: the same GPU UUIDs, and for each the model (product_name)
// and memory (fb_memory_usage/total, MiB). It prints a line per GPU and
// exits 1 on any difference. scripts/gpu-check.sh runs it:
//
//	go run ./scripts/gpucheck node.json nvidia-smi-q-x.xml
package main

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

type node struct {
	Facts struct {
		Accelerators []struct {
			UUID        string `json:"uuid"`
			Model       string `json:"model"`
			MemoryBytes int64  `json:"memory_bytes"`
		} `json:"accelerators"`
	} `json:"facts"`
}

type smiLog struct {
	GPUs []struct {
		UUID        string `xml:"uuid"`
		ProductName string `xml:"product_name"`
		MemoryTotal string `xml:"fb_memory_usage>total"`
	} `xml:"gpu"`
}

type gpu struct {
	model string
	mib   int64
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go run compare.go NODE_JSON NVIDIA_SMI_Q_X_XML")
		os.Exit(2)
	}
	agent, tool, err := read(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
	uuids := map[string]bool{}
	for u := range agent {
		uuids[u] = true
	}
	for u := range tool {
		uuids[u] = true
	}
	sorted := make([]string, 0, len(uuids))
	for u := range uuids {
		sorted = append(sorted, u)
	}
	sort.Strings(sorted)
	bad := 0
	for _, u := range sorted {
		a, inAgent := agent[u]
		t, inTool := tool[u]
		switch {
		case !inAgent:
			fmt.Printf("DIFF  %s: nvidia-smi -q -x lists it (%s, %d MiB), the agent does not\n", u, t.model, t.mib)
			bad++
		case !inTool:
			fmt.Printf("DIFF  %s: the agent lists it (%s, %d MiB), nvidia-smi -q -x does not\n", u, a.model, a.mib)
			bad++
		case a != t:
			fmt.Printf("DIFF  %s: the agent says %s, %d MiB; nvidia-smi -q -x says %s, %d MiB\n", u, a.model, a.mib, t.model, t.mib)
			bad++
		default:
			fmt.Printf("same  %s: %s, %d MiB\n", u, a.model, a.mib)
		}
	}
	if len(sorted) == 0 {
		fmt.Println("DIFF  neither lists any GPU")
		bad++
	}
	if bad > 0 {
		fmt.Printf("%d of %d GPUs differ\n", bad, len(sorted))
		os.Exit(1)
	}
	fmt.Printf("all %d GPUs agree\n", len(sorted))
}

// read parses both files into GPUs by UUID.
func read(nodeFile, xmlFile string) (agent, tool map[string]gpu, err error) {
	raw, err := os.ReadFile(nodeFile)
	if err != nil {
		return nil, nil, err
	}
	var n node
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, nil, fmt.Errorf("%s: %v", nodeFile, err)
	}
	agent = map[string]gpu{}
	for _, a := range n.Facts.Accelerators {
		agent[a.UUID] = gpu{model: a.Model, mib: a.MemoryBytes >> 20}
	}
	raw, err = os.ReadFile(xmlFile)
	if err != nil {
		return nil, nil, err
	}
	var l smiLog
	dec := xml.NewDecoder(strings.NewReader(string(raw)))
	dec.Strict = false // the DOCTYPE names a DTD that is not read
	if err := dec.Decode(&l); err != nil {
		return nil, nil, fmt.Errorf("%s: %v", xmlFile, err)
	}
	tool = map[string]gpu{}
	for _, g := range l.GPUs {
		mib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(g.MemoryTotal), "MiB")), 10, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: GPU %s: memory total %q is not N MiB", xmlFile, g.UUID, g.MemoryTotal)
		}
		tool[g.UUID] = gpu{model: g.ProductName, mib: mib}
	}
	return agent, tool, nil
}
