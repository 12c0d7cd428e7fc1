package schemacheck

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/outflow-dev/outflow/events"
)

// Mode says whose reading the check protects, after Confluent Schema
// Registry's compatibility modes.
type Mode string

const (
	// Backward (the default): the code built now reads every stored
	// event, of every version recorded in the snapshot (the outbox's
	// history, the broker's retention, replays, dead letters). It is
	// transitive by construction: every frozen version is checked, not
	// only the newest.
	Backward Mode = "backward"
	// Forward: consumers still on the code the snapshot was recorded
	// with read the events the new code writes (producers deployed
	// first).
	Forward Mode = "forward"
	// Full: both.
	Full Mode = "full"
)

// ErrBadMode is what [ParseMode] returns for a name that is no mode.
var ErrBadMode = errors.New("unknown compatibility mode")

// ParseMode reads a mode's name, in any case; "" is [Backward].
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return Backward, nil
	case Backward, Forward, Full:
		return m, nil
	}
	return "", fmt.Errorf("%w %q: backward, forward or full", ErrBadMode, s)
}

func (m Mode) covers(b Mode) bool {
	switch m {
	case "", Backward:
		return b == Backward || b == Full
	case Forward:
		return b == Forward || b == Full
	}
	return true
}

// Rule names what a [Violation] breaks. The table in docs/events.md says
// when each applies and in which mode.
type Rule string

// The rules.
const (
	RuleTypeChanged          Rule = "type-changed"
	RuleRequiredAdded        Rule = "required-added"
	RuleRemovedStrict        Rule = "removed-from-strict-type"
	RuleRequiredRemoved      Rule = "required-removed"
	RuleBecameRequired       Rule = "became-required"
	RuleBecameOptional       Rule = "became-optional"
	RuleLikelyRename         Rule = "likely-rename"
	RuleUnknownToStrict      Rule = "unknown-to-strict-reader"
	RuleStoredUnreadable     Rule = "stored-version-unreadable"
	RuleTypeUnregistered     Rule = "type-unregistered"
	RuleVersionLowered       Rule = "version-lowered"
	RuleVersionRaised        Rule = "version-raised"
	RuleStoredSampleRejected Rule = "stored-sample-rejected"
	RuleUpcastLeftover       Rule = "upcast-leaves-field"
	RuleUpcastMissing        Rule = "upcast-misses-field"
)

// Violation is one change that breaks a reader.
type Violation struct {
	EventType string
	// Version is the schema version whose stored events (or readers) it
	// breaks.
	Version int
	// Field is the dotted path of the field at fault ("" for the whole
	// type); "[]" stands for an array's items, "{}" for a map's values.
	Field string
	Rule  Rule
	// Breaks is whose reading breaks: Backward (the new code, reading
	// stored events), Forward (the old code, reading new events) or Full
	// (both).
	Breaks  Mode
	Message string
}

func (v Violation) String() string {
	where := fmt.Sprintf("%s v%d", v.EventType, v.Version)
	if v.Field != "" {
		where += " field " + v.Field
	}
	return fmt.Sprintf("%s: %s (%s): %s", where, v.Rule, v.Breaks, v.Message)
}

// Options tune [Compare].
type Options struct {
	// Mode is the compatibility mode; "" is [Backward].
	Mode Mode
	// Samples are real stored payloads (from the outbox's history, say)
	// that must still decode, validation included, under Backward and
	// Full: a payload the generated ones cannot stand for.
	Samples []StoredSample
}

// StoredSample is a payload as stored, at its schema version.
type StoredSample struct {
	EventType string
	Version   int
	Payload   json.RawMessage
}

// Compare checks reg against snap and returns what breaks in opts.Mode,
// sorted by event type, version and field; none means reg is compatible.
// A registered type the snapshot lacks is new, not a violation. The error
// is for a registry or options it cannot check.
func Compare(snap *Snapshot, reg *events.Registry, opts Options) ([]Violation, error) {
	if _, err := ParseMode(string(opts.Mode)); err != nil {
		return nil, err
	}
	if snap == nil {
		snap = &Snapshot{Format: FormatVersion}
	}
	var all []Violation
	for name, old := range snap.Events {
		vs, err := compareType(name, old, reg)
		if err != nil {
			return nil, err
		}
		all = append(all, vs...)
	}
	for _, s := range opts.Samples {
		if _, err := reg.DecodeVersion(s.EventType, s.Version, s.Payload); err != nil {
			all = append(all, Violation{EventType: s.EventType, Version: s.Version, Field: errorField(err),
				Rule: RuleStoredSampleRejected, Breaks: Backward,
				Message: fmt.Sprintf("the stored payload %s no longer decodes: %v", s.Payload, err)})
		}
	}
	out := all[:0]
	for _, v := range all {
		if opts.Mode.covers(v.Breaks) {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b Violation) int {
		return cmp.Or(strings.Compare(a.EventType, b.EventType), cmp.Compare(a.Version, b.Version),
			strings.Compare(a.Field, b.Field), strings.Compare(string(a.Rule), string(b.Rule)))
	})
	return out, nil
}

func compareType(name string, old *EventType, reg *events.Registry) ([]Violation, error) {
	latest := old.Latest()
	if latest == nil {
		return nil, nil
	}
	if _, ok := reg.GoType(name); !ok {
		return []Violation{{EventType: name, Version: latest.Version, Rule: RuleTypeUnregistered, Breaks: Backward,
			Message: fmt.Sprintf("event type %q is in the snapshot (version %s) but no longer registered: its stored events cannot be decoded. "+
				"Register it again; only once no stored event of it remains (outbox history, broker retention, dead letters) drop it from the snapshot with an explicit update",
				name, versionList(old))}}, nil
	}
	now, err := current(reg, name)
	if err != nil {
		return nil, err
	}
	cur := now.Versions[0]
	var out []Violation
	switch {
	case cur.Version < latest.Version:
		out = append(out, Violation{EventType: name, Version: latest.Version, Rule: RuleVersionLowered, Breaks: Backward,
			Message: fmt.Sprintf("the schema version went down from %d to %d: stored version %d events are newer than this build and cannot be decoded (events.ErrUnknownVersion: they would wait for a deploy). "+
				"Keep version %d (a schema version only goes up) and raise it with an upcaster for a new shape",
				latest.Version, cur.Version, latest.Version, latest.Version)})
	case cur.Version > latest.Version:
		out = append(out, Violation{EventType: name, Version: cur.Version, Rule: RuleVersionRaised, Breaks: Forward,
			Message: fmt.Sprintf("the schema version went up from %d to %d: consumers still on the old code cannot read version %d events (events.ErrUnknownVersion) "+
				"and hold them, with their aggregate's later events, until they are redeployed. Deploy every consumer of %q before its producers",
				latest.Version, cur.Version, cur.Version, name)})
	default:
		c := &comparison{name: name, version: cur.Version, oldStrict: old.Strict, newStrict: now.Strict}
		c.object(latest.Shape, cur.Shape, "")
		out = append(out, c.out...)
	}
	// Every frozen version must still reach the Go type through the
	// upcasters: a payload of its shape is decoded as a stored one is.
	for _, v := range old.Versions {
		if v.Version >= cur.Version {
			continue
		}
		sample := Sample(v.Shape)
		_, err := reg.DecodeVersion(name, v.Version, sample)
		var invalid *events.ValidationError
		if err == nil || errors.As(err, &invalid) {
			// A Validate refusing the generated values judges the values,
			// not the shape: real payloads go in Options.Samples. What a
			// lenient decode hides, the upcast payload shows: a field of
			// the old shape left behind, a required one never filled in.
			up, err := reg.Upcast(name, v.Version, sample)
			if err != nil {
				return nil, fmt.Errorf("event type %q: upcast from version %d: %w", name, v.Version, err)
			}
			var doc any
			if err := json.Unmarshal(up, &doc); err != nil {
				return nil, fmt.Errorf("event type %q: upcast from version %d: %w", name, v.Version, err)
			}
			extra, missing := residue(doc, cur.Shape, "")
			for _, f := range extra {
				out = append(out, Violation{EventType: name, Version: v.Version, Field: f, Rule: RuleUpcastLeftover, Breaks: Backward,
					Message: fmt.Sprintf("a stored version %d event, upcast to version %d, still has this field, which version %d does not: the upcasters do not convert it and the new code drops its value. "+
						"The upcaster must move (or delete) it; the sample was %s, upcast %s", v.Version, cur.Version, cur.Version, sample, up)})
			}
			for _, f := range missing {
				out = append(out, Violation{EventType: name, Version: v.Version, Field: f, Rule: RuleUpcastMissing, Breaks: Backward,
					Message: fmt.Sprintf("a stored version %d event, upcast to version %d, lacks this required field: the new code reads its zero value. "+
						"The upcaster must fill it in; the sample was %s, upcast %s", v.Version, cur.Version, sample, up)})
			}
			continue
		}
		out = append(out, Violation{EventType: name, Version: v.Version, Field: errorField(err), Rule: RuleStoredUnreadable, Breaks: Backward,
			Message: fmt.Sprintf("a stored version %d event no longer decodes into version %d (%s): %v. "+
				"The upcasters must turn every version %d payload into one the Go type reads; the sample was %s",
				v.Version, cur.Version, cur.GoType, err, v.Version, sample)})
	}
	return out, nil
}

func versionList(e *EventType) string {
	var vs []string
	for _, v := range e.Versions {
		vs = append(vs, fmt.Sprint(v.Version))
	}
	return strings.Join(vs, ", ")
}

func errorField(err error) string {
	var m *events.MalformedPayloadError
	if errors.As(err, &m) {
		return m.Field
	}
	return ""
}

// comparison compares two shapes of one event type at one version.
type comparison struct {
	name                 string
	version              int
	oldStrict, newStrict bool
	out                  []Violation
}

func (c *comparison) add(field string, rule Rule, breaks Mode, format string, args ...any) {
	c.out = append(c.out, Violation{EventType: c.name, Version: c.version, Field: field, Rule: rule, Breaks: breaks,
		Message: fmt.Sprintf(format, args...)})
}

// bump is the advice for a change that needs a new schema version.
func (c *comparison) bump(what string) string {
	return fmt.Sprintf("raise the type's SchemaVersion to %d and register an upcaster from version %d that %s (RegisterVersioned)", c.version+1, c.version, what)
}

func describe(s *Shape) string {
	switch {
	case s.Kind == Opaque:
		return "opaque " + s.GoType
	case s.Format != "" && s.Kind == String && (s.Format == "date-time" || s.Format == "base64"):
		return string(s.Kind) + " (" + s.Format + ")"
	case s.Format != "":
		return "quoted " + s.Format
	case s.Kind == Array && s.Items != nil:
		return "array of " + describe(s.Items)
	case s.Kind == Map && s.Items != nil:
		return "map of " + describe(s.Items)
	}
	return string(s.Kind)
}

// shape compares one value's shapes; path names it.
func (c *comparison) shape(old, now *Shape, path string) {
	changed := old.Kind != now.Kind || old.Format != now.Format ||
		(old.Kind == Opaque && old.GoType != now.GoType) ||
		(old.Kind == Map && old.Key != now.Key) ||
		(old.Kind == Object && (old.Recursive || now.Recursive) && (old.Recursive != now.Recursive || old.GoType != now.GoType))
	if changed {
		c.add(path, RuleTypeChanged, Full,
			"the field changed from %s to %s at the same schema version: stored version %d events hold the old type and no longer decode, and consumers on the old code cannot read the new one. Instead, %s",
			describe(old), describe(now), c.version, c.bump("converts the field"))
		return
	}
	switch old.Kind {
	case Array:
		c.shape(old.Items, now.Items, path+"[]")
	case Map:
		c.shape(old.Items, now.Items, path+"{}")
	case Object:
		if !old.Recursive {
			c.object(old, now, path)
		}
	}
}

// object compares two objects' fields.
func (c *comparison) object(old, now *Shape, path string) {
	var removed, added []string
	for _, name := range sortedFields(old) {
		if _, ok := now.Fields[name]; !ok {
			removed = append(removed, name)
		}
	}
	for _, name := range sortedFields(now) {
		o, ok := old.Fields[name]
		if !ok {
			added = append(added, name)
			continue
		}
		n := now.Fields[name]
		p := joinPath(path, name)
		c.shape(&o.Shape, &n.Shape, p)
		switch {
		case !o.Required && n.Required:
			c.add(p, RuleBecameRequired, Backward,
				"the field became required (no omitempty, not a pointer), but stored version %d events may lack it: the new code would read its zero value. Keep it optional, or %s",
				c.version, c.bump("fills it in"))
		case o.Required && !n.Required:
			c.add(p, RuleBecameOptional, Forward,
				"the field became optional: consumers still on the old code expect it in every event and would read its zero value when the new code leaves it out. Keep writing it (no omitempty), or %s and deploy the consumers first",
				c.bump("marks its absence"))
		}
	}
	// A field gone and another come in one object is most likely a
	// rename, which no reader survives: pair them, same kind first.
	paired := map[string]bool{}
	for _, r := range removed {
		pick := ""
		for _, a := range added {
			if !paired[a] && old.Fields[r].Kind == now.Fields[a].Kind {
				pick = a
				break
			}
		}
		if pick == "" {
			for _, a := range added {
				if !paired[a] {
					pick = a
					break
				}
			}
		}
		if pick == "" {
			c.removed(old.Fields[r], joinPath(path, r))
			continue
		}
		paired[pick] = true
		c.add(joinPath(path, r), RuleLikelyRename, Full,
			"the field was removed and %q added: a likely rename. Stored version %d events carry %q, which the new code does not read (it sees %q empty), and consumers on the old code miss it in new events. A rename needs a new schema version: %s",
			joinPath(path, pick), c.version, r, pick, c.bump(fmt.Sprintf("moves %q to %q", r, pick)))
	}
	for _, a := range added {
		if !paired[a] {
			c.added(now.Fields[a], joinPath(path, a))
		}
	}
}

func (c *comparison) removed(f *Field, p string) {
	if c.newStrict {
		c.add(p, RuleRemovedStrict, Backward,
			"the field was removed, but the type decodes strictly: stored version %d events carry it and would be refused as an unknown field. Keep the field, or %s",
			c.version, c.bump("deletes it"))
	}
	if f.Required {
		c.add(p, RuleRequiredRemoved, Forward,
			"the required field was removed: consumers still on the old code expect it in every event and would read its zero value until redeployed. Keep writing it, or %s and deploy the consumers first",
			c.bump("drops it"))
	}
}

func (c *comparison) added(f *Field, p string) {
	if f.Required {
		c.add(p, RuleRequiredAdded, Backward,
			"a new required field (no omitempty, not a pointer): stored version %d events lack it and the new code would read its zero value. Make it optional (omitempty, or a pointer) and handle its absence, or %s",
			c.version, c.bump("fills it in"))
	}
	if c.oldStrict {
		c.add(p, RuleUnknownToStrict, Forward,
			"a new field, and the consumers still on the old code decode strictly: they refuse every new event as having an unknown field until redeployed. Deploy the consumers first, then update the snapshot")
	}
}

// residue compares a decoded JSON value with shape s: the fields it has
// that s does not (extra), and the required ones of s it lacks (missing),
// by dotted path. Opaque and any values are not looked into.
func residue(v any, s *Shape, path string) (extra, missing []string) {
	switch s.Kind {
	case Object:
		m, ok := v.(map[string]any)
		if !ok || s.Recursive {
			return nil, nil
		}
		for k := range m {
			if _, ok := s.Fields[k]; !ok {
				extra = append(extra, joinPath(path, k))
			}
		}
		for _, name := range sortedFields(s) {
			f := s.Fields[name]
			x, ok := m[name]
			if !ok {
				if f.Required {
					missing = append(missing, joinPath(path, name))
				}
				continue
			}
			e, mi := residue(x, &f.Shape, joinPath(path, name))
			extra, missing = append(extra, e...), append(missing, mi...)
		}
	case Array:
		if a, ok := v.([]any); ok {
			for _, x := range a {
				e, mi := residue(x, s.Items, path+"[]")
				extra, missing = append(extra, e...), append(missing, mi...)
			}
		}
	case Map:
		if m, ok := v.(map[string]any); ok {
			for _, x := range m {
				e, mi := residue(x, s.Items, path+"{}")
				extra, missing = append(extra, e...), append(missing, mi...)
			}
		}
	}
	slices.Sort(extra)
	slices.Sort(missing)
	return slices.Compact(extra), slices.Compact(missing)
}
