package schemacheck

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
)

// Sample returns a payload of shape s: every field present, each value of
// its kind (a one-item array, a one-key map), an opaque type's recorded
// example (left out when none was recorded). It stands for a stored event
// of the version: what the upcasters and the Go type must still read.
func Sample(s *Shape) json.RawMessage {
	var b strings.Builder
	writeSample(&b, s)
	return json.RawMessage(b.String())
}

func writeSample(b *strings.Builder, s *Shape) {
	switch s.Kind {
	case String:
		switch s.Format {
		case "date-time":
			b.WriteString(`"2024-02-29T12:34:56.789Z"`)
		case "base64":
			b.WriteString(`"c2FtcGxl"`)
		case "integer":
			b.WriteString(`"1"`)
		case "number":
			b.WriteString(`"1.5"`)
		case "boolean":
			b.WriteString(`"true"`)
		case "string":
			b.WriteString(`"\"sample\""`)
		default:
			b.WriteString(`"sample"`)
		}
	case Integer:
		b.WriteString("1")
	case Number:
		b.WriteString("1.5")
	case Boolean:
		b.WriteString("true")
	case Any:
		b.WriteString(`"sample"`)
	case Opaque:
		if len(s.Example) > 0 {
			b.Write(s.Example)
		} else {
			b.WriteString("null")
		}
	case Array:
		b.WriteString("[")
		writeSample(b, s.Items)
		b.WriteString("]")
	case Map:
		if s.Key == Integer {
			b.WriteString(`{"1":`)
		} else {
			b.WriteString(`{"key":`)
		}
		writeSample(b, s.Items)
		b.WriteString("}")
	case Object:
		b.WriteString("{")
		first := true
		for _, name := range sortedFields(s) {
			f := s.Fields[name]
			if f.Kind == Opaque && len(f.Example) == 0 {
				continue
			}
			if !first {
				b.WriteString(",")
			}
			first = false
			k, _ := json.Marshal(name)
			b.Write(k)
			b.WriteString(":")
			writeSample(b, &f.Shape)
		}
		b.WriteString("}")
	default:
		b.WriteString("null")
	}
}

func sortedFields(s *Shape) []string {
	names := make([]string, 0, len(s.Fields))
	for n := range s.Fields {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func reflectZero(t reflect.Type) any { return reflect.Zero(t).Interface() }
