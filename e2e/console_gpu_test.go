package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mercator/mercator/api"
)

// TestConsoleGPUsAndDrain drives the console's node page in headless
// chromium against a real control plane and an agent standing in an
// 8×H100 machine (the fake nvidia-smi): each GPU with its model, memory
// and health, the card a running run holds with its utilization as the
// node sampled it, and a drain's progress until nothing is left, on the page and from
// `mercator node drain --wait`.
func TestConsoleGPUsAndDrain(t *testing.T) {
	requireGPUHook(t)
	c := startCluster(t)
	m := newSwitchableMachine(t, gpuMachine, "")
	node := c.startSwitchableAgent(t, "gpuui", m)
	run := c.submit(gpuRun(1, "sleep", "300"))
	var r api.Run
	c.waitFor("run "+run.ID+" reporting GPU usage", func() bool {
		var err error
		r, err = c.client.GetRun(c.ctx, run.ID)
		return err == nil && r.Status == api.RunRunning && len(r.Attempts[0].GPUUsage) == 1
	})
	if _, err := c.client.DrainNode(c.ctx, node, 0); err != nil {
		t.Fatal(err)
	}
	b := startBrowser(t, c.ctx)
	b.signIn(c.url, c.token)
	b.do("the node's link on Fleet", chromedp.Navigate(c.url+"/ui/fleet"), chromedp.Click(`//a[text()="`+node+`"]`),
		chromedp.WaitVisible(chromedp.CSS("#gpus")))
	gpu := r.Attempts[0].GPUUsage[0]
	row := `//table[@id="gpus"]//tr[th/code[text()="` + gpu.UUID + `"]]`
	text := browserGet(b, "the held GPU's row", chromedp.Text(row))
	for _, want := range []string{"NVIDIA H100 80GB HBM3", "79.6 GiB", "healthy", "busy by " + run.ID + "/1", pct(gpu.UtilLast)} {
		if !strings.Contains(text, want) {
			t.Errorf("the held GPU's row %q lacks %q", text, want)
		}
	}
	cards := browserGet(b, "count GPU rows", chromedp.Evaluate[int](`document.querySelectorAll("#gpus tbody tr").length`))
	if cards != 8 {
		t.Errorf("the node page lists %d GPUs, want 8", cards)
	}
	b.do("the drain's progress", until(`document.getElementById("drain-left").textContent === "draining: 1 runs and 0 function containers left"`))
	b.shot("node-draining")
	// The CLI waits for the drain too (`node drain --wait`), returning once
	// nothing is left.
	drained := make(chan string, 1)
	go func() {
		out, errOut, code := c.mercatorExit("", "node", "drain", "--wait", node)
		drained <- fmt.Sprintf("exit %d: %s%s", code, out, errOut)
	}()
	if _, err := c.client.CancelRun(c.ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	c.wait(run.ID)
	if got := <-drained; !strings.HasPrefix(got, "exit 0: node "+node+": draining; running work may finish (0 attempts on it)") {
		t.Errorf("node drain --wait: %s", got)
	}
	c.waitFor("the drain done on the node page", func() bool {
		b.do("reload the node page", chromedp.Navigate(c.url+"/ui/nodes/"+node), chromedp.WaitVisible(chromedp.CSS("#drain-left")))
		return browserGet(b, "read the drain's progress", chromedp.Text(chromedp.CSS("#drain-left"))) == "drained: nothing left on it"
	})
	b.shot("node-drained")
}

// pct is a utilization as the console prints it.
func pct(v float64) string { return fmt.Sprintf("%.0f%%", v) }
