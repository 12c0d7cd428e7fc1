package outflowtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/schemacheck"
)

type invoiceV1 struct {
	InvoiceID string `json:"invoice_id"`
	Amount    int64  `json:"amount"`
}

func (invoiceV1) EventType() string { return "invoice.paid" }

type invoiceWithNote struct {
	invoiceV1
	Note string `json:"note,omitempty"`
}

type invoiceRenamed struct {
	InvoiceID   string `json:"invoice_id"`
	AmountMinor int64  `json:"amount_minor"`
}

func (invoiceRenamed) EventType() string { return "invoice.paid" }

type invoiceV2 struct{ invoiceRenamed }

func (invoiceV2) SchemaVersion() int { return 2 }

// compatRecorder records what RequireCompatibleEvents reports.
type compatRecorder struct {
	errs, logs []string
}

func (*compatRecorder) Helper()      {}
func (*compatRecorder) Name() string { return "TestEventSchemas" }
func (r *compatRecorder) Errorf(format string, a ...any) {
	r.errs = append(r.errs, sprintf(format, a...))
}
func (r *compatRecorder) Logf(format string, a ...any) {
	r.logs = append(r.logs, sprintf(format, a...))
}
func (*compatRecorder) FailNow() { panic(failNow{}) }

func sprintf(format string, a ...any) string { return strings.TrimSpace(fmt.Sprintf(format, a...)) }

// checkSchemas runs the helper with update set or not, and returns what it
// reported and the snapshot file after it.
func checkSchemas(t *testing.T, path string, update bool, p events.Payload, ups ...events.Upcaster) (*compatRecorder, string) {
	t.Helper()
	reg := events.NewRegistry()
	if err := reg.RegisterVersioned(p, ups...); err != nil {
		t.Fatal(err)
	}
	r := &compatRecorder{}
	env := ""
	if update {
		env = "1"
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				if _, ok := p.(failNow); !ok {
					panic(p)
				}
			}
		}()
		requireCompatibleEvents(r, reg, path, env)
	}()
	b, _ := os.ReadFile(path)
	return r, string(b)
}

func TestRequireCompatibleEvents(t *testing.T) {
	path := filepath.Join(t.TempDir(), "event-schemas.json")
	rerun := "OUTFLOW_UPDATE_EVENT_SCHEMAS=1 go test -run '^TestEventSchemas$' ."

	r, file := checkSchemas(t, path, false, invoiceV1{})
	if len(r.errs) != 1 || !strings.Contains(r.errs[0], "no event schema snapshot") || !strings.Contains(r.errs[0], rerun) || file != "" {
		t.Fatalf("no snapshot yet: %q, file %q; want a failure saying how to record it, and no file", r.errs, file)
	}

	r, v1File := checkSchemas(t, path, true, invoiceV1{})
	if len(r.errs) != 0 || !strings.Contains(v1File, `"invoice.paid"`) {
		t.Fatalf("update: %q, file %q", r.errs, v1File)
	}
	if r, file = checkSchemas(t, path, false, invoiceV1{}); len(r.errs) != 0 || file != v1File {
		t.Fatalf("unchanged: %q", r.errs)
	}

	// A break fails without touching the file, and says what an update
	// would mean.
	r, file = checkSchemas(t, path, false, invoiceRenamed{})
	if len(r.errs) != 1 || file != v1File {
		t.Fatalf("rename: %q; the file must stay as it was", r.errs)
	}
	for _, want := range []string{"invoice.paid v1 field amount: likely-rename", rerun, "accept these breaks explicitly"} {
		if !strings.Contains(r.errs[0], want) {
			t.Errorf("rename: the failure lacks %q:\n%s", want, r.errs[0])
		}
	}

	// A compatible change still fails until recorded: the file describes
	// what is stored.
	r, file = checkSchemas(t, path, false, invoiceWithNote{})
	if len(r.errs) != 1 || !strings.Contains(r.errs[0], "out of date") || !strings.Contains(r.errs[0], rerun) || file != v1File {
		t.Fatalf("new optional field: %q", r.errs)
	}

	// The rename as version 2 with its upcaster passes, and its update
	// keeps version 1 frozen.
	up := events.Upcaster{From: 1, Func: func(old json.RawMessage) (json.RawMessage, error) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(old, &m); err != nil {
			return nil, err
		}
		m["amount_minor"] = m["amount"]
		delete(m, "amount")
		return json.Marshal(m)
	}}
	if r, _ = checkSchemas(t, path, false, invoiceV2{}, up); len(r.errs) != 1 || !strings.Contains(r.errs[0], "out of date") {
		t.Fatalf("v2: %q, want only out of date", r.errs)
	}
	r, file = checkSchemas(t, path, true, invoiceV2{}, up)
	snap, err := schemacheck.Parse([]byte(file))
	if err != nil || len(r.errs) != 0 {
		t.Fatalf("v2 update: %q %v", r.errs, err)
	}
	if vs := snap.Events["invoice.paid"].Versions; len(vs) != 2 || vs[0].Shape.Fields["amount"] == nil {
		t.Fatalf("v2 update: versions %+v, want v1 (with amount) kept", vs)
	}

	// An explicit update accepts a break, and logs it.
	r, file = checkSchemas(t, path, true, invoiceV1{})
	if len(r.errs) != 0 || !strings.Contains(strings.Join(r.logs, "\n"), "ACCEPTED") || !strings.Contains(strings.Join(r.logs, "\n"), "version-lowered") {
		t.Fatalf("accepted break: errs %q logs %q", r.errs, r.logs)
	}
	if file != v1File {
		t.Fatalf("after accepting version 1 again the file is:\n%s", file)
	}
}
