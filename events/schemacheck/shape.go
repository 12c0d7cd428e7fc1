package schemacheck

import (
	"cmp"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Kind is the JSON kind of a value, as encoding/json writes it.
type Kind string

// The kinds of a [Shape].
const (
	String  Kind = "string"
	Integer Kind = "integer"
	Number  Kind = "number"
	Boolean Kind = "boolean"
	Object  Kind = "object" // a struct: named fields
	Array   Kind = "array"  // a slice or array: Items
	Map     Kind = "map"    // a map: string keys (Key says otherwise), Items
	Any     Kind = "any"    // an interface: anything
	// Opaque is a type with its own JSON (MarshalJSON/UnmarshalJSON, or
	// MarshalText/UnmarshalText): its shape is its code's, known here by its
	// Go type's name only.
	Opaque Kind = "opaque"
)

// Shape is the JSON shape of a Go type as encoding/json sees it.
type Shape struct {
	Kind Kind `json:"kind"`
	// Format refines a kind: "date-time" (time.Time), "base64" ([]byte);
	// for a value quoted into a string (the ",string" tag option) the kind
	// it holds: "integer", "number", "boolean", "string".
	Format string `json:"format,omitempty"`
	// GoType names an opaque type (and a recursive one, cut short).
	GoType string `json:"go_type,omitempty"`
	// Recursive marks a struct met again inside itself: its fields are
	// those of the enclosing GoType.
	Recursive bool `json:"recursive,omitempty"`
	// Key is a map's key kind when not a string (integer keys are quoted).
	Key Kind `json:"key,omitempty"`
	// Fields are an object's, by JSON name.
	Fields map[string]*Field `json:"fields,omitempty"`
	// Items is an array's element, a map's value.
	Items *Shape `json:"items,omitempty"`
	// Example is an opaque type's zero value as it marshals, what a sample
	// payload of the shape uses for it (absent: the sample leaves it out).
	Example json.RawMessage `json:"example,omitempty"`
}

// Field is a field of an object.
type Field struct {
	// Required is true when the producer always writes the field: neither
	// omitzero nor an omitempty that applies (it does not to a struct,
	// which encoding/json always writes), not a pointer or an interface
	// (nor inside an embedded struct pointer), which encode as null or not
	// at all. A stored event of the version always has it.
	Required bool `json:"required,omitempty"`
	Shape
}

var (
	timeType          = reflect.TypeFor[time.Time]()
	numberType        = reflect.TypeFor[json.Number]()
	jsonMarshaler     = reflect.TypeFor[json.Marshaler]()
	jsonUnmarshaler   = reflect.TypeFor[json.Unmarshaler]()
	textMarshaler     = reflect.TypeFor[encoding.TextMarshaler]()
	textUnmarshaler   = reflect.TypeFor[encoding.TextUnmarshaler]()
	byteSliceElemKind = reflect.Uint8
)

// ShapeOf returns the JSON shape of t. A type encoding/json cannot write (a
// channel, a function, a complex number) is an error naming its path.
func ShapeOf(t reflect.Type) (*Shape, error) {
	return shapeOf(t, "", map[reflect.Type]bool{})
}

func shapeOf(t reflect.Type, path string, inProgress map[reflect.Type]bool) (*Shape, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == timeType:
		return &Shape{Kind: String, Format: "date-time"}, nil
	case t == numberType:
		return &Shape{Kind: Number}, nil
	case ownJSON(t):
		return &Shape{Kind: Opaque, GoType: t.String(), Example: zeroJSON(t)}, nil
	}
	switch t.Kind() {
	case reflect.String:
		return &Shape{Kind: String}, nil
	case reflect.Bool:
		return &Shape{Kind: Boolean}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return &Shape{Kind: Integer}, nil
	case reflect.Float32, reflect.Float64:
		return &Shape{Kind: Number}, nil
	case reflect.Interface:
		return &Shape{Kind: Any}, nil
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && t.Elem().Kind() == byteSliceElemKind && !ownJSON(t.Elem()) {
			return &Shape{Kind: String, Format: "base64"}, nil
		}
		items, err := shapeOf(t.Elem(), path+"[]", inProgress)
		if err != nil {
			return nil, err
		}
		return &Shape{Kind: Array, Items: items}, nil
	case reflect.Map:
		s := &Shape{Kind: Map}
		switch k := t.Key(); {
		case k.Kind() == reflect.String, ownText(k):
		case k.Kind() >= reflect.Int && k.Kind() <= reflect.Uintptr:
			s.Key = Integer
		default:
			return nil, fmt.Errorf("%s: map key type %s has no JSON form", displayPath(path), k)
		}
		items, err := shapeOf(t.Elem(), path+"{}", inProgress)
		if err != nil {
			return nil, err
		}
		s.Items = items
		return s, nil
	case reflect.Struct:
		if inProgress[t] {
			return &Shape{Kind: Object, GoType: t.String(), Recursive: true}, nil
		}
		inProgress[t] = true
		defer delete(inProgress, t)
		s := &Shape{Kind: Object, Fields: map[string]*Field{}}
		for _, f := range jsonFields(t) {
			fs, err := shapeOf(f.typ, joinPath(path, f.name), inProgress)
			if err != nil {
				return nil, err
			}
			if f.quoted {
				fs = &Shape{Kind: String, Format: string(fs.Kind)}
			}
			k := f.typ.Kind()
			// omitempty leaves out false, 0, "", nil and empty slices
			// and maps: a struct (a time.Time too) is always written.
			emptyable := k != reflect.Struct && (k != reflect.Array || f.typ.Len() == 0)
			required := !(f.omitEmpty && emptyable) && !f.omitZero && !f.viaPointer && k != reflect.Pointer && k != reflect.Interface
			s.Fields[f.name] = &Field{Required: required, Shape: *fs}
		}
		return s, nil
	}
	return nil, fmt.Errorf("%s: %s has no JSON form", displayPath(path), t)
}

// ownJSON reports whether t (or *t) marshals or unmarshals itself: what
// encoding/json calls instead of looking at its fields.
func ownJSON(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	for _, i := range []reflect.Type{jsonMarshaler, jsonUnmarshaler} {
		if t.Implements(i) || pt.Implements(i) {
			return true
		}
	}
	return ownText(t)
}

func ownText(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	for _, i := range []reflect.Type{textMarshaler, textUnmarshaler} {
		if t.Implements(i) || pt.Implements(i) {
			return true
		}
	}
	return false
}

// zeroJSON is t's zero value as it marshals; nil when it does not (or its
// MarshalJSON panics on a zero value).
func zeroJSON(t reflect.Type) (out json.RawMessage) {
	defer func() {
		if recover() != nil {
			out = nil
		}
	}()
	b, err := json.Marshal(reflect.New(t).Interface())
	if err != nil {
		return nil
	}
	return b
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func displayPath(path string) string {
	if path == "" {
		return "the payload"
	}
	return "field " + path
}

// jsonField is a struct field as encoding/json encodes it.
type jsonField struct {
	name       string
	tagged     bool
	index      []int
	typ        reflect.Type
	omitEmpty  bool
	omitZero   bool
	quoted     bool
	viaPointer bool // inside an embedded *struct: absent when it is nil
}

// jsonFields lists the fields encoding/json writes for struct t: its
// typeFields, which it does not export (embedded structs promoted
// breadth-first, a tagged name dominant over an untagged one at the same
// depth, an ambiguous name dropped).
func jsonFields(t reflect.Type) []jsonField {
	type embedded struct {
		typ        reflect.Type
		index      []int
		viaPointer bool
	}
	var fields []jsonField
	next := []embedded{{typ: t}}
	visited := map[reflect.Type]bool{}
	for len(next) > 0 {
		current := next
		next = nil
		count := map[reflect.Type]int{}
		for _, e := range current {
			count[e.typ]++
		}
		for _, e := range current {
			if visited[e.typ] {
				continue
			}
			visited[e.typ] = true
			for i := range e.typ.NumField() {
				sf := e.typ.Field(i)
				if sf.Anonymous {
					et := sf.Type
					if et.Kind() == reflect.Pointer {
						et = et.Elem()
					}
					if !sf.IsExported() && et.Kind() != reflect.Struct {
						continue
					}
				} else if !sf.IsExported() {
					continue
				}
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, opts, _ := strings.Cut(tag, ",")
				index := append(slices.Clone(e.index), i)
				ft := sf.Type
				if ft.Name() == "" && ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if name != "" || !sf.Anonymous || ft.Kind() != reflect.Struct {
					f := jsonField{
						name: name, tagged: name != "", index: index, typ: sf.Type,
						omitEmpty:  hasOpt(opts, "omitempty"),
						omitZero:   hasOpt(opts, "omitzero"),
						viaPointer: e.viaPointer,
					}
					if f.name == "" {
						f.name = sf.Name
					}
					if hasOpt(opts, "string") {
						switch ft.Kind() {
						case reflect.Bool, reflect.String, reflect.Float32, reflect.Float64,
							reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
							reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
							f.quoted = true
						}
					}
					fields = append(fields, f)
					if count[e.typ] > 1 {
						// The same embedded type twice at this depth: its
						// names are ambiguous, and dropped below.
						fields = append(fields, f)
					}
					continue
				}
				next = append(next, embedded{typ: ft, index: index, viaPointer: e.viaPointer || sf.Type.Kind() == reflect.Pointer})
			}
		}
	}
	slices.SortFunc(fields, func(a, b jsonField) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		if c := cmp.Compare(len(a.index), len(b.index)); c != 0 {
			return c
		}
		if a.tagged != b.tagged {
			if a.tagged {
				return -1
			}
			return 1
		}
		return slices.Compare(a.index, b.index)
	})
	var out []jsonField
	for i := 0; i < len(fields); {
		j := i + 1
		for j < len(fields) && fields[j].name == fields[i].name {
			j++
		}
		if f, ok := dominant(fields[i:j]); ok {
			out = append(out, f)
		}
		i = j
	}
	return out
}

// dominant picks the field of one name encoding/json keeps: the shallowest,
// tagged before untagged; none when two tie.
func dominant(fs []jsonField) (jsonField, bool) {
	if len(fs) > 1 && len(fs[0].index) == len(fs[1].index) && fs[0].tagged == fs[1].tagged {
		return jsonField{}, false
	}
	return fs[0], true
}

func hasOpt(opts, want string) bool {
	for o := range strings.SplitSeq(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}
