package schemacheck

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

type money struct {
	Value    int64  `json:"value"`
	Currency string `json:"currency"`
}

// cents marshals itself: its JSON is its code's.
type cents int64

func (c cents) MarshalJSON() ([]byte, error) { return json.Marshal(float64(c) / 100) }
func (c *cents) UnmarshalJSON(b []byte) error {
	var f float64
	err := json.Unmarshal(b, &f)
	*c = cents(f * 100)
	return err
}

type Base struct {
	Tenant string `json:"tenant"`
	Hidden string `json:"hidden"`
}

type Audit struct {
	By string `json:"by"`
}

type node struct {
	Name     string `json:"name"`
	Children []node `json:"children,omitempty"`
}

type shapes struct {
	Base                         // promoted: tenant, hidden
	*Audit                       // promoted, optional: by
	Hidden     int               `json:"hidden"` // shallower: wins over Base's
	Tagged     money             `json:"tagged"` // an object, not promoted
	Renamed    string            `json:"renamed_to"`
	NoTag      bool              //
	Omit       string            `json:"omit,omitempty"`
	OmitZero   money             `json:"omit_zero,omitzero"`
	OmitStruct time.Time         `json:"omit_struct,omitempty"` // omitempty does nothing to a struct
	Skipped    string            `json:"-"`
	Dash       string            `json:"-,"`
	unexported string            // encoding/json ignores it
	Ptr        *int64            `json:"ptr"`
	At         time.Time         `json:"at"`
	AtPtr      *time.Time        `json:"at_ptr"`
	Bytes      []byte            `json:"bytes"`
	Quoted     int64             `json:"quoted,string"`
	Number     json.Number       `json:"number"`
	Float      float32           `json:"float"`
	Anything   any               `json:"anything"`
	Own        cents             `json:"own"`
	Text       netip.Addr        `json:"text"`
	Lines      []money           `json:"lines"`
	Labels     map[string]string `json:"labels"`
	ByID       map[int]bool      `json:"by_id"`
	Tree       node              `json:"tree"`
}

func TestShapeOfIsWhatEncodingJSONWrites(t *testing.T) {
	s, err := ShapeOf(reflect.TypeFor[shapes]())
	if err != nil {
		t.Fatal(err)
	}
	str := func(s *Shape) string {
		out := string(s.Kind)
		if s.Format != "" {
			out += "/" + s.Format
		}
		if s.GoType != "" {
			out += "<" + s.GoType + ">"
		}
		if s.Key != "" {
			out += "[" + string(s.Key) + "]"
		}
		if s.Items != nil {
			out += " of " + string(s.Items.Kind)
		}
		return out
	}
	want := map[string]string{
		"tenant":      "string required",
		"hidden":      "integer required",
		"by":          "string optional",
		"tagged":      "object required",
		"renamed_to":  "string required",
		"NoTag":       "boolean required",
		"omit":        "string optional",
		"omit_zero":   "object optional",
		"omit_struct": "string/date-time required",
		"-":           "string required",
		"ptr":         "integer optional",
		"at":          "string/date-time required",
		"at_ptr":      "string/date-time optional",
		"bytes":       "string/base64 required",
		"quoted":      "string/integer required",
		"number":      "number required",
		"float":       "number required",
		"anything":    "any optional",
		"own":         "opaque<schemacheck.cents> required",
		"text":        "opaque<netip.Addr> required",
		"lines":       "array of object required",
		"labels":      "map of string required",
		"by_id":       "map[integer] of boolean required",
		"tree":        "object required",
	}
	got := map[string]string{}
	for name, f := range s.Fields {
		req := "optional"
		if f.Required {
			req = "required"
		}
		got[name] = str(&f.Shape) + " " + req
	}
	if !reflect.DeepEqual(got, want) {
		for k := range mergeKeys(got, want) {
			if got[k] != want[k] {
				t.Errorf("field %q: got %q, want %q", k, got[k], want[k])
			}
		}
	}
	if s.Fields["tagged"].Fields["currency"] == nil || !s.Fields["tagged"].Fields["value"].Required {
		t.Errorf("nested object: %+v", s.Fields["tagged"].Fields)
	}
	if ex := string(s.Fields["own"].Example); ex != "0" {
		t.Errorf("opaque example %q, want its zero value as it marshals: 0", ex)
	}
	children := s.Fields["tree"].Fields["children"]
	if children == nil || children.Items.Kind != Object || !children.Items.Recursive || children.Items.GoType != "schemacheck.node" {
		t.Errorf("recursive type: %+v", children)
	}

	// The sample of the shape decodes into the type it was taken from.
	var back shapes
	if err := json.Unmarshal(Sample(s), &back); err != nil {
		t.Fatalf("sample %s: %v", Sample(s), err)
	}
}

func mergeKeys(a, b map[string]string) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

type ambiguousA struct {
	Name string
}
type ambiguousB struct {
	Name string
}

func TestShapeOfDropsWhatEncodingJSONDrops(t *testing.T) {
	type both struct {
		ambiguousA
		ambiguousB
		Kept int `json:"kept"`
	}
	s, err := ShapeOf(reflect.TypeFor[both]())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(both{Kept: 1})
	if _, ok := s.Fields["Name"]; ok || len(s.Fields) != 1 || string(b) != `{"kept":1}` {
		t.Fatalf("fields %v; encoding/json writes %s", s.Fields, b)
	}
}

func TestShapeOfNamesWhatHasNoJSONForm(t *testing.T) {
	type bad struct {
		Inner struct {
			C chan int `json:"c"`
		} `json:"inner"`
	}
	_, err := ShapeOf(reflect.TypeFor[bad]())
	if err == nil || !strings.Contains(err.Error(), "field inner.c") {
		t.Fatalf("got %v, want an error naming inner.c", err)
	}
}
