package payouts_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The example is built on the framework alone: nothing of the reference
// payments service (app, handlers) or of the outflow CLI reaches it.
func TestBuiltOnTheFrameworkAlone(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const mod = "github.com/outflow-dev/outflow/"
	for _, pkg := range strings.Fields(string(out)) {
		rest, ok := strings.CutPrefix(pkg, mod)
		if !ok {
			continue
		}
		for _, banned := range []string{"app", "handlers", "cmd/outflow/internal/cli", "cmd/outflow/internal/demo", "cmd/outflow-bench/internal/bench", "cmd"} {
			if rest == banned || strings.HasPrefix(rest, banned+"/") || strings.HasPrefix(rest, banned+" ") {
				t.Errorf("examples/payouts depends on %s", pkg)
			}
		}
	}
}
