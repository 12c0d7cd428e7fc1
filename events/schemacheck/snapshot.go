package schemacheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/outflow-dev/outflow/events"
)

// FormatVersion is the snapshot file's format: a file of another format is
// refused rather than misread.
const FormatVersion = 1

// ErrNoSnapshot is what [Load] returns (wrapped, with the path) for a
// snapshot file that does not exist yet.
var ErrNoSnapshot = errors.New("no event schema snapshot")

// Snapshot is the committed record of every schema version of every event
// type a service has ever written: what its stored events look like. A
// version older than the type's current one is frozen: [Update] never
// rewrites it, since events of that shape are still in the outbox's
// history, on the broker and in the dead letters.
type Snapshot struct {
	Format int                   `json:"format"`
	Events map[string]*EventType `json:"events"`
}

// EventType is one event type's schema versions, oldest first.
type EventType struct {
	// Strict is whether the type decodes strictly ([events.StrictDecoder]):
	// the consumers deployed with this snapshot refuse unknown fields.
	Strict   bool       `json:"strict,omitempty"`
	Versions []*Version `json:"versions"`
}

// Version is the JSON shape of one schema version of an event type.
type Version struct {
	Version int `json:"version"`
	// GoType is the payload's Go type when the version was recorded (for
	// the reader; the check compares shapes, not names).
	GoType string `json:"go_type"`
	// Shape is the payload's shape: an object.
	Shape *Shape `json:"shape"`
}

// Latest returns the newest version recorded, nil when none is.
func (e *EventType) Latest() *Version {
	if e == nil || len(e.Versions) == 0 {
		return nil
	}
	return e.Versions[len(e.Versions)-1]
}

// At returns version v, nil when it is not recorded.
func (e *EventType) At(v int) *Version {
	if e == nil {
		return nil
	}
	for _, x := range e.Versions {
		if x.Version == v {
			return x
		}
	}
	return nil
}

// Build returns the snapshot of reg as it is now: each registered event
// type at its current schema version only (see [Update] to keep the older
// ones of a committed snapshot).
func Build(reg *events.Registry) (*Snapshot, error) {
	s := &Snapshot{Format: FormatVersion, Events: map[string]*EventType{}}
	for _, name := range reg.Types() {
		e, err := current(reg, name)
		if err != nil {
			return nil, err
		}
		s.Events[name] = e
	}
	return s, nil
}

// current is the registry's entry for name at its current version.
func current(reg *events.Registry, name string) (*EventType, error) {
	t, ok := reg.GoType(name)
	if !ok {
		return nil, fmt.Errorf("event type %q is not registered", name)
	}
	v, _ := reg.SchemaVersion(name)
	shape, err := ShapeOf(t)
	if err != nil {
		return nil, fmt.Errorf("event type %q (%s): %w", name, t, err)
	}
	e := &EventType{Versions: []*Version{{Version: v, GoType: t.String(), Shape: shape}}}
	if sd, ok := reflectZero(t).(events.StrictDecoder); ok {
		e.Strict = sd.StrictDecoding()
	}
	return e, nil
}

// Update returns the snapshot that accepts reg as it is: each registered
// type's current version recorded (replacing the same version's entry),
// its older versions kept as they were, newer ones (a version that went
// down) and types no longer registered dropped. Accepting a break this
// way is the developer's explicit decision: run [Compare] first.
func Update(old *Snapshot, reg *events.Registry) (*Snapshot, error) {
	now, err := Build(reg)
	if err != nil {
		return nil, err
	}
	if old == nil {
		return now, nil
	}
	for name, e := range now.Events {
		prev := old.Events[name]
		if prev == nil {
			continue
		}
		cur := e.Versions[0]
		var kept []*Version
		for _, v := range prev.Versions {
			if v.Version < cur.Version {
				kept = append(kept, v)
			}
		}
		e.Versions = append(kept, cur)
	}
	return now, nil
}

// Marshal returns the snapshot's file: indented JSON, keys sorted, versions
// oldest first, so that a change reads as a small diff in review.
func (s *Snapshot) Marshal() ([]byte, error) {
	for _, e := range s.Events {
		slices.SortFunc(e.Versions, func(a, b *Version) int { return a.Version - b.Version })
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write writes the snapshot's file at path.
func (s *Snapshot) Write(path string) error {
	b, err := s.Marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write event schema snapshot: %w", err)
	}
	return nil
}

// Parse reads a snapshot file's content.
func Parse(b []byte) (*Snapshot, error) {
	var s Snapshot
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("event schema snapshot: %w", err)
	}
	if s.Format != FormatVersion {
		return nil, fmt.Errorf("event schema snapshot: format %d, this build reads format %d", s.Format, FormatVersion)
	}
	if s.Events == nil {
		s.Events = map[string]*EventType{}
	}
	for name, e := range s.Events {
		if e == nil || len(e.Versions) == 0 {
			return nil, fmt.Errorf("event schema snapshot: event type %q has no versions", name)
		}
		for i, v := range e.Versions {
			if v == nil || v.Shape == nil || v.Version < 1 || (i > 0 && v.Version <= e.Versions[i-1].Version) {
				return nil, fmt.Errorf("event schema snapshot: event type %q: versions must be 1 or more, each with a shape, in increasing order", name)
			}
		}
	}
	return &s, nil
}

// Load reads the snapshot file at path; a missing file is an error that
// errors.Is [ErrNoSnapshot].
func Load(path string) (*Snapshot, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", ErrNoSnapshot, path)
	}
	if err != nil {
		return nil, fmt.Errorf("read event schema snapshot: %w", err)
	}
	s, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}
