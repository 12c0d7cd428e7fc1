package layering_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/outflow-dev/outflow"

// framework lists the framework's roots: each, and every package under it,
// is framework. New subpackages (brokers/redis, brokers/nats...) are found,
// not listed.
var framework = []string{"events", "forwarder", "consumer", "idempotency", "migrations", "outflowtest", "brokers", "tracing", "examples", "replay", "walrelay", "webhooks"}

// app lists what the framework must never reach: the reference service and
// the binaries, with their internals (cmd/outflow/internal/cli, demo,
// config; cmd/outflow-bench/internal/bench).
var app = []string{"app", "handlers", "cmd"}

// under reports whether pkg (a module-relative path) is root or below it.
func under(pkg string, roots []string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return pkg == r || strings.HasPrefix(pkg, r+"/") })
}

// rel returns pkg relative to the module, with any test variant suffix
// (" [x.test]") cut, and false for packages of other modules.
func rel(pkg string) (string, bool) {
	pkg, _, _ = strings.Cut(pkg, " ")
	if pkg == module {
		return "", true
	}
	return strings.CutPrefix(pkg, module+"/")
}

func isApp(pkg string) bool {
	r, ok := rel(pkg)
	return ok && under(r, app)
}

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pkg string
		app bool
	}{
		{module + "/app", true},
		{module + "/app/paymentevents", true},
		{module + "/app/paymentevents [" + module + "/events.test]", true},
		{module + "/handlers", true},
		{module + "/cmd/outflow/internal/cli", true},
		{module + "/cmd/outflow/internal/demo", true},
		{module + "/cmd/outflow-bench/internal/bench", true},
		{module + "/cmd/outflow", true},
		{module + "/application", false},
		{module + "/internal/backoff", false},
		{module + "/events", false},
		{"github.com/other/app", false},
	}
	for _, tt := range tests {
		if got := isApp(tt.pkg); got != tt.app {
			t.Errorf("isApp(%q) = %v, want %v", tt.pkg, got, tt.app)
		}
	}
}

// graph is the import graph go list gives: package (test variants
// included) to its direct imports.
type graph map[string][]string

func goList(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// load returns the framework packages of the module and the import graph of
// them and their tests.
func load(t *testing.T) ([]string, graph) {
	t.Helper()
	var pkgs []string
	for _, p := range strings.Fields(string(goList(t, module+"/..."))) {
		if r, ok := rel(p); ok && under(r, framework) {
			pkgs = append(pkgs, p)
		}
	}
	g := graph{}
	sc := bufio.NewScanner(bytes.NewReader(goList(t, append([]string{"-deps", "-test", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}"}, pkgs...)...)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, imports, _ := strings.Cut(sc.Text(), "|")
		if imports != "" {
			g[name] = strings.Split(imports, ",")
		} else {
			g[name] = nil
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return pkgs, g
}

// reach returns the import chain from root to the first application package
// it reaches, or nil.
func (g graph) reach(root string) []string {
	if _, ok := g[root]; !ok {
		return nil
	}
	prev := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if isApp(p) {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, q := range g[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

// No framework package, nor its tests and examples, reaches the reference
// application or the binaries' code.
func TestFrameworkDoesNotImportTheApp(t *testing.T) {
	t.Parallel()
	pkgs, g := load(t)
	// The check must see what it guards: a framework package list that
	// missed these would pass vacuously.
	for _, want := range []string{"events", "events/outbox", "forwarder", "consumer", "idempotency", "migrations", "outflowtest", "brokers"} {
		if !slices.Contains(pkgs, module+"/"+want) && !slices.ContainsFunc(pkgs, func(p string) bool { return strings.HasPrefix(p, module+"/"+want+"/") }) {
			t.Errorf("framework package %s not found by go list", want)
		}
	}
	for _, p := range pkgs {
		if chain := g.reach(p); chain != nil {
			t.Errorf("%s reaches the application: %s", p, strings.Join(chain, " -> "))
		}
		if chain := g.reach(p + ".test"); chain != nil {
			t.Errorf("the tests of %s reach the application: %s", p, strings.Join(chain, " -> "))
		}
	}
}

// The check finds an application package when there is one: the reference
// handlers reach app.
func TestReachFindsTheApp(t *testing.T) {
	t.Parallel()
	g := graph{}
	sc := bufio.NewScanner(bytes.NewReader(goList(t, "-deps", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}", module+"/handlers")))
	for sc.Scan() {
		name, imports, _ := strings.Cut(sc.Text(), "|")
		g[name] = strings.Split(imports, ",")
	}
	// handlers is itself application code; start from what it imports.
	var found bool
	for _, q := range g[module+"/handlers"] {
		if chain := g.reach(q); chain != nil && strings.HasPrefix(chain[len(chain)-1], module+"/app") {
			found = true
		}
	}
	if !found {
		t.Fatal("the handlers' imports reach no app package: the check would miss a violation")
	}
}
