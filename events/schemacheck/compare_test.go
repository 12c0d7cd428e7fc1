package schemacheck_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/schemacheck"
)

// Every type below is a shape of one event type, "t.e", at some point of
// its life. v1 is where each test starts.
type v1 struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Note   string `json:"note,omitempty"`
	Money  money  `json:"money"`
}

type money struct {
	Value    int64  `json:"value"`
	Currency string `json:"currency"`
}

type moneyText struct {
	Value    string `json:"value"`
	Currency string `json:"currency"`
}

type (
	typeChanged struct {
		ID     string `json:"id"`
		Amount string `json:"amount"`
		Note   string `json:"note,omitempty"`
		Money  money  `json:"money"`
	}
	nestedChanged struct {
		ID     string    `json:"id"`
		Amount int64     `json:"amount"`
		Note   string    `json:"note,omitempty"`
		Money  moneyText `json:"money"`
	}
	requiredAdded struct {
		v1
		Fee int64 `json:"fee"`
	}
	optionalAdded struct {
		v1
		Fee  int64   `json:"fee,omitempty"`
		Memo *string `json:"memo"`
	}
	requiredRemoved struct {
		ID    string `json:"id"`
		Note  string `json:"note,omitempty"`
		Money money  `json:"money"`
	}
	optionalRemoved struct {
		ID     string `json:"id"`
		Amount int64  `json:"amount"`
		Money  money  `json:"money"`
	}
	renamed struct {
		ID          string `json:"id"`
		AmountMinor int64  `json:"amount_minor"`
		Note        string `json:"note,omitempty"`
		Money       money  `json:"money"`
	}
	becameOptional struct {
		ID     string `json:"id"`
		Amount int64  `json:"amount,omitempty"`
		Note   string `json:"note,omitempty"`
		Money  money  `json:"money"`
	}
	becameRequired struct {
		ID     string `json:"id"`
		Amount int64  `json:"amount"`
		Note   string `json:"note"`
		Money  money  `json:"money"`
	}
	strictV1              struct{ v1 }
	strictOptionalRemoved struct{ optionalRemoved }
	strictOptionalAdded   struct{ optionalAdded }
	// v2 moved amount into money: the version went up.
	v2 struct {
		ID    string `json:"id"`
		Note  string `json:"note,omitempty"`
		Money money  `json:"money"`
	}
	v2Strict struct{ v2 }
	// v3 added a required fee, which its upcaster must fill in.
	v3 struct {
		v2
		Fee int64 `json:"fee"`
	}
	// v1Validating refuses every value it is given: the check must not
	// take that for a shape it cannot read.
	v2Validating struct{ v2 }
)

func (v1) EventType() string                       { return "t.e" }
func (typeChanged) EventType() string              { return "t.e" }
func (nestedChanged) EventType() string            { return "t.e" }
func (requiredRemoved) EventType() string          { return "t.e" }
func (optionalRemoved) EventType() string          { return "t.e" }
func (renamed) EventType() string                  { return "t.e" }
func (becameOptional) EventType() string           { return "t.e" }
func (becameRequired) EventType() string           { return "t.e" }
func (strictV1) StrictDecoding() bool              { return true }
func (strictOptionalRemoved) StrictDecoding() bool { return true }
func (strictOptionalAdded) StrictDecoding() bool   { return true }
func (v2) EventType() string                       { return "t.e" }
func (v2) SchemaVersion() int                      { return 2 }
func (v3) SchemaVersion() int                      { return 3 }
func (v2Strict) StrictDecoding() bool              { return true }
func (v2Validating) Validate() error               { return errors.New("no value is good enough") }

// moveAmount is v1 to v2's upcaster: amount moves into money.value.
func moveAmount(old json.RawMessage) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(old, &m); err != nil {
		return nil, err
	}
	var mon map[string]json.RawMessage
	if err := json.Unmarshal(m["money"], &mon); err != nil {
		return nil, err
	}
	mon["value"] = m["amount"]
	delete(m, "amount")
	b, err := json.Marshal(mon)
	m["money"] = b
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// identity forgets to convert anything.
func identity(old json.RawMessage) (json.RawMessage, error) { return old, nil }

func registry(t *testing.T, p events.Payload, ups ...events.Upcaster) *events.Registry {
	t.Helper()
	r := events.NewRegistry()
	if err := r.RegisterVersioned(p, ups...); err != nil {
		t.Fatal(err)
	}
	return r
}

// snapshotOf records the registries in turn, as commits of a service
// would, each with an explicit update.
func snapshotOf(t *testing.T, regs ...*events.Registry) *schemacheck.Snapshot {
	t.Helper()
	var s *schemacheck.Snapshot
	for _, r := range regs {
		var err error
		if s, err = schemacheck.Update(s, r); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestCompareRules(t *testing.T) {
	up := events.Upcaster{From: 1, Func: moveAmount}
	bad := events.Upcaster{From: 1, Func: identity}
	tests := []struct {
		name string
		old  []events.Payload // recorded in turn (versions 1, 2, ...)
		now  *events.Registry
		mode schemacheck.Mode
		want []string // "field rule", "" field for the type
	}{
		{"unchanged", nil, registry(t, v1{}), schemacheck.Full, nil},
		{"type changed", nil, registry(t, typeChanged{}), schemacheck.Backward, []string{"amount type-changed"}},
		{"type changed, forward", nil, registry(t, typeChanged{}), schemacheck.Forward, []string{"amount type-changed"}},
		{"nested type changed", nil, registry(t, nestedChanged{}), schemacheck.Backward, []string{"money.value type-changed"}},
		{"new required field", nil, registry(t, requiredAdded{}), schemacheck.Backward, []string{"fee required-added"}},
		{"new required field, forward", nil, registry(t, requiredAdded{}), schemacheck.Forward, nil},
		{"new optional fields", nil, registry(t, optionalAdded{}), schemacheck.Full, nil},
		{"new optional field, strict old readers, forward", []events.Payload{strictV1{}}, registry(t, strictOptionalAdded{}), schemacheck.Forward,
			[]string{"fee unknown-to-strict-reader", "memo unknown-to-strict-reader"}},
		{"new optional field, strict old readers, backward", []events.Payload{strictV1{}}, registry(t, strictOptionalAdded{}), schemacheck.Backward, nil},
		{"required field removed, backward", nil, registry(t, requiredRemoved{}), schemacheck.Backward, nil},
		{"required field removed, forward", nil, registry(t, requiredRemoved{}), schemacheck.Forward, []string{"amount required-removed"}},
		{"optional field removed", nil, registry(t, optionalRemoved{}), schemacheck.Full, nil},
		{"optional field removed, strict", []events.Payload{strictV1{}}, registry(t, strictOptionalRemoved{}), schemacheck.Backward,
			[]string{"note removed-from-strict-type"}},
		{"rename", nil, registry(t, renamed{}), schemacheck.Backward, []string{"amount likely-rename"}},
		{"rename, forward", nil, registry(t, renamed{}), schemacheck.Forward, []string{"amount likely-rename"}},
		{"became optional", nil, registry(t, becameOptional{}), schemacheck.Full, []string{"amount became-optional"}},
		{"became optional, backward", nil, registry(t, becameOptional{}), schemacheck.Backward, nil},
		{"became required", nil, registry(t, becameRequired{}), schemacheck.Full, []string{"note became-required"}},
		{"version raised with its upcaster", nil, registry(t, v2{}, up), schemacheck.Backward, nil},
		{"version raised, forward", nil, registry(t, v2{}, up), schemacheck.Forward, []string{" version-raised"}},
		{"version raised, strict, upcaster keeps the old field", nil, registry(t, v2Strict{}, bad), schemacheck.Backward,
			[]string{"amount stored-version-unreadable"}},
		{"version raised, upcaster converts nothing, lenient", nil, registry(t, v2{}, bad), schemacheck.Full,
			[]string{"amount upcast-leaves-field", " version-raised"}},
		{"version raised, upcaster leaves a required field out", nil, registry(t, v3{}, events.Upcaster{From: 1, Func: moveAmount}, events.Upcaster{From: 2, Func: identity}),
			schemacheck.Backward, []string{"fee upcast-misses-field"}},
		{"version raised, type refuses generated values", nil, registry(t, v2Validating{}, up), schemacheck.Backward, nil},
		{"frozen v1 checked at v2 too", []events.Payload{v1{}, v2{}}, registry(t, v2Strict{}, bad), schemacheck.Backward,
			[]string{"amount stored-version-unreadable"}},
		{"version lowered", []events.Payload{v1{}, v2{}}, registry(t, v1{}), schemacheck.Backward, []string{" version-lowered"}},
		{"type unregistered", []events.Payload{v1{}}, events.NewRegistry(), schemacheck.Backward, []string{" type-unregistered"}},
		{"type unregistered, forward", []events.Payload{v1{}}, events.NewRegistry(), schemacheck.Forward, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.old == nil {
				tt.old = []events.Payload{v1{}}
			}
			var regs []*events.Registry
			for i, p := range tt.old {
				var ups []events.Upcaster
				if i > 0 {
					ups = []events.Upcaster{up}
				}
				regs = append(regs, registry(t, p, ups...))
			}
			snap := snapshotOf(t, regs...)
			vs, err := schemacheck.Compare(snap, tt.now, schemacheck.Options{Mode: tt.mode})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, v := range vs {
				got = append(got, v.Field+" "+string(v.Rule))
				if v.EventType != "t.e" || v.Version < 1 || v.Message == "" {
					t.Errorf("violation %+v does not say which type, version and why", v)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
				for _, v := range vs {
					t.Log(v)
				}
			}
		})
	}
}

// A version bump keeps the older version in the snapshot as it was, and
// the explicit update accepts a break at the current version.
func TestUpdateKeepsFrozenVersions(t *testing.T) {
	snap := snapshotOf(t, registry(t, v1{}), registry(t, v2{}, events.Upcaster{From: 1, Func: moveAmount}))
	e := snap.Events["t.e"]
	if len(e.Versions) != 2 || e.Versions[0].Version != 1 || e.Versions[1].Version != 2 {
		t.Fatalf("versions %+v, want 1 and 2", e.Versions)
	}
	if e.Versions[0].Shape.Fields["amount"] == nil || e.Versions[1].Shape.Fields["amount"] != nil {
		t.Fatalf("v1 must keep amount, v2 must not: %+v", e)
	}
	b, err := snap.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := schemacheck.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := back.Marshal()
	if string(again) != string(b) {
		t.Fatalf("the file does not read back as written:\n%s\n%s", b, again)
	}
	if !strings.Contains(string(b), "\"version\": 1,\n") {
		t.Fatalf("not indented for a diff:\n%s", b)
	}
}

func TestParseRefusesWhatItCannotRead(t *testing.T) {
	for _, in := range []string{
		`{"format": 2, "events": {}}`,
		`{"format": 1, "events": {"t.e": {"versions": []}}}`,
		`{"format": 1, "events": {"t.e": {"versions": [{"version": 2, "go_type": "x", "shape": {"kind": "object"}}, {"version": 1, "go_type": "x", "shape": {"kind": "object"}}]}}}`,
		`{"format": 1, "events": {}, "extra": true}`,
	} {
		if _, err := schemacheck.Parse([]byte(in)); err == nil {
			t.Errorf("%s: parsed", in)
		}
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]schemacheck.Mode{"": schemacheck.Backward, "FULL": schemacheck.Full, " forward ": schemacheck.Forward} {
		if got, err := schemacheck.ParseMode(in); err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	if _, err := schemacheck.ParseMode("sideways"); !errors.Is(err, schemacheck.ErrBadMode) {
		t.Errorf("sideways: %v", err)
	}
}

// A real stored payload given as a sample is decoded as a consumer would,
// its validation included.
func TestStoredSamples(t *testing.T) {
	reg := registry(t, v2Validating{}, events.Upcaster{From: 1, Func: moveAmount})
	snap := snapshotOf(t, reg)
	vs, err := schemacheck.Compare(snap, reg, schemacheck.Options{Samples: []schemacheck.StoredSample{
		{EventType: "t.e", Version: 1, Payload: json.RawMessage(`{"id":"a","amount":5,"money":{"value":0,"currency":"EUR"}}`)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 1 || vs[0].Rule != schemacheck.RuleStoredSampleRejected || vs[0].Version != 1 {
		t.Fatalf("got %v, want the sample rejected", vs)
	}
}
