package schemacheck_test

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/schemacheck"
)

// The refund event as first shipped, version 1.
type refundV1 struct {
	RefundID string `json:"refund_id"`
	Amount   int64  `json:"amount"`
}

func (refundV1) EventType() string { return "refund.issued" }

// The same event, its amount renamed in place: what a developer might try.
type refundRenamed struct {
	RefundID    string `json:"refund_id"`
	AmountMinor int64  `json:"amount_minor"`
}

func (refundRenamed) EventType() string { return "refund.issued" }

// The rename done right: version 2, with an upcaster from version 1.
type refundV2 struct {
	RefundID    string `json:"refund_id"`
	AmountMinor int64  `json:"amount_minor"`
}

func (refundV2) EventType() string  { return "refund.issued" }
func (refundV2) SchemaVersion() int { return 2 }

func renameAmount(old json.RawMessage) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(old, &m); err != nil {
		return nil, err
	}
	m["amount_minor"] = m["amount"]
	delete(m, "amount")
	return json.Marshal(m)
}

func mustRegistry(p events.Payload, ups ...events.Upcaster) *events.Registry {
	r := events.NewRegistry()
	if err := r.RegisterVersioned(p, ups...); err != nil {
		panic(err)
	}
	return r
}

// The snapshot committed with version 1 catches a rename at the same
// version, naming the type, the version, the field and the rule; the
// rename as a version 2 with its upcaster passes, and the update keeps
// version 1's shape, which stored events still have.
func Example() {
	snap, err := schemacheck.Build(mustRegistry(refundV1{}))
	if err != nil {
		panic(err)
	}

	vs, err := schemacheck.Compare(snap, mustRegistry(refundRenamed{}), schemacheck.Options{})
	if err != nil {
		panic(err)
	}
	for _, v := range vs {
		fmt.Println(v.EventType, v.Version, v.Field, v.Rule)
	}

	v2 := mustRegistry(refundV2{}, events.Upcaster{From: 1, Func: renameAmount})
	vs, err = schemacheck.Compare(snap, v2, schemacheck.Options{Mode: schemacheck.Backward})
	if err != nil {
		panic(err)
	}
	fmt.Println("version 2, backward:", len(vs), "violations")
	vs, _ = schemacheck.Compare(snap, v2, schemacheck.Options{Mode: schemacheck.Full})
	for _, v := range vs {
		fmt.Println("version 2, full:", v.Rule)
	}

	snap, err = schemacheck.Update(snap, v2)
	if err != nil {
		panic(err)
	}
	for _, v := range snap.Events["refund.issued"].Versions {
		fmt.Println("recorded version", v.Version, "fields", sortedNames(v.Shape))
	}
	// Output:
	// refund.issued 1 amount likely-rename
	// version 2, backward: 0 violations
	// version 2, full: version-raised
	// recorded version 1 fields [amount refund_id]
	// recorded version 2 fields [amount_minor refund_id]
}

func sortedNames(s *schemacheck.Shape) []string {
	var names []string
	for n := range s.Fields {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
