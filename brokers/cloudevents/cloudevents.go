package cloudevents

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/events"
)

// SpecVersion is the CloudEvents version of the attributes.
const SpecVersion = "1.0"

// DataContentType is every Outflow event's datacontenttype: the payload is
// the event's JSON (the discard marker's is the empty object).
const DataContentType = "application/json"

// DefaultSource is Config.Source when it is empty. An absolute URI, as the
// CloudEvents spec recommends for source, and stable: Outflow cannot know
// the name of the service it runs in, and the id (a UUIDv7) already makes
// source+id unique. Set Source to the producing service's own URI (e.g.
// "https://payments.example.com" or "/payments") to tell producers apart.
const DefaultSource = "urn:outflow"

// The template variables of Config.DataSchema.
const (
	TypeVar    = "{type}"
	VersionVar = "{version}"
)

// The extension attributes Outflow adds (CloudEvents extension names: a-z
// and 0-9, at most 20 characters). Traceparent is the CloudEvents
// distributed-tracing extension's, PartitionKey the partitioning
// extension's (the aggregate id: the key Outflow orders by).
const (
	ExtAggregateType    = "aggregatetype"
	ExtAggregateVersion = "aggregateversion"
	ExtSchemaVersion    = "schemaversion"
	ExtCorrelationID    = "correlationid"
	ExtTraceparent      = "traceparent"
	ExtPartitionKey     = "partitionkey"
)

// ErrInvalidConfig is wrapped by [Config.Validate]'s errors.
var ErrInvalidConfig = errors.New("cloudevents config")

// Config says whether and how the CloudEvents attributes are written. The
// zero value writes them, with [DefaultSource] and no dataschema.
type Config struct {
	// Disabled turns the attributes off: the messages are what they were
	// before (Outflow's own metadata only).
	Disabled bool
	// Source is the source attribute of every event, a URI-reference.
	// Defaults to [DefaultSource].
	Source string
	// DataSchema, when set, is a template of the dataschema attribute, an
	// absolute URI in which {type} is replaced by the event type (path
	// escaped) and {version} by the schema version (1 when the event has
	// none), e.g. "https://schemas.example.com/{type}/v{version}.json".
	// Defaults to "": no dataschema.
	DataSchema string
}

// WithDefaults returns c with its empty fields set.
func (c Config) WithDefaults() Config {
	if c.Source == "" {
		c.Source = DefaultSource
	}
	return c
}

// Validate reports a Source that is not a URI-reference and a DataSchema
// that does not give an absolute URI, naming the field.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if err := uriReference(c.Source); err != nil {
		return fmt.Errorf("%w: Source %q is not a URI-reference: %w", ErrInvalidConfig, c.Source, err)
	}
	if c.DataSchema != "" {
		s := c.dataSchema("payment.paid", 1)
		if err := uriReference(s); err != nil {
			return fmt.Errorf("%w: DataSchema %q is not a URI template: %w", ErrInvalidConfig, c.DataSchema, err)
		}
		if u, _ := url.Parse(s); !u.IsAbs() {
			return fmt.Errorf("%w: DataSchema %q does not give an absolute URI (e.g. https://schemas.example.com/{type}/v{version}.json)", ErrInvalidConfig, c.DataSchema)
		}
	}
	return nil
}

// uriReference checks s is a URI-reference (RFC 3986): not empty, no
// space or control character (which url.Parse lets through), and parsed
// by net/url.
func uriReference(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r > unicode.MaxASCII }); i >= 0 {
		return fmt.Errorf("character %q at %d (percent-encode it)", s[i:i+1], i)
	}
	_, err := url.Parse(s)
	return err
}

func (c Config) dataSchema(eventType string, version int) string {
	r := strings.NewReplacer(TypeVar, url.PathEscape(eventType), VersionVar, strconv.Itoa(version))
	return r.Replace(c.DataSchema)
}

// Attribute is one CloudEvents attribute: a context attribute or an
// extension, by its CloudEvents name, with its value as a string (the
// canonical string form binary content mode carries).
type Attribute struct {
	Name, Value string
}

// Attributes are msg's CloudEvents attributes, derived from its UUID and
// envelope metadata (as [forwarder.Message] writes them): id, source,
// specversion, type, time, subject, datacontenttype, dataschema when
// configured, and the extensions of what else the envelope says. An
// attribute whose metadata is missing is left out (a message without an
// event type has no type: the reader's SDK then refuses it, as it should).
// c must be valid; its defaults are applied.
func (c Config) Attributes(msg *message.Message) []Attribute {
	c = c.WithDefaults()
	md := msg.Metadata
	out := make([]Attribute, 0, 14)
	add := func(name, value string) {
		if value != "" {
			out = append(out, Attribute{name, value})
		}
	}
	id := msg.UUID
	if id == "" {
		id = md.Get(events.MessageIDKey)
	}
	eventType := md.Get(events.EventTypeKey)
	add("id", id)
	add("source", c.Source)
	add("specversion", SpecVersion)
	add("type", eventType)
	add("time", md.Get(events.OccurredAtKey))
	add("subject", md.Get(events.AggregateIDKey))
	add("datacontenttype", DataContentType)
	if c.DataSchema != "" && eventType != "" {
		v, err := strconv.Atoi(md.Get(events.SchemaVersionKey))
		if err != nil || v < 1 {
			v = 1 // written before versions existed: version 1, as events reads it
		}
		add("dataschema", c.dataSchema(eventType, v))
	}
	add(ExtAggregateType, md.Get(events.AggregateTypeKey))
	add(ExtAggregateVersion, md.Get(events.AggregateVersionKey))
	add(ExtSchemaVersion, md.Get(events.SchemaVersionKey))
	add(ExtCorrelationID, md.Get(events.CorrelationIDKey))
	add(ExtTraceparent, md.Get(events.TraceparentKey))
	add(ExtPartitionKey, md.Get(events.AggregateIDKey))
	return out
}

// Binding is where a broker carries the attributes in binary content
// mode: each one under Prefix+name, except datacontenttype, which goes
// under ContentTypeKey. The keys are message metadata keys: the backend's
// marshaller turns them into its headers (Kafka, NATS, AMQP) or fields
// (Redis).
type Binding struct {
	// Name is the binding's, for the docs and errors.
	Name string
	// Prefix of each attribute's key.
	Prefix string
	// ContentTypeKey is datacontenttype's key.
	ContentTypeKey string
}

// The bindings of the built-in backends.
var (
	// Kafka is the CloudEvents Kafka protocol binding: headers ce_<name>
	// and content-type.
	Kafka = Binding{Name: "kafka", Prefix: "ce_", ContentTypeKey: "content-type"}
	// NATS is the CloudEvents NATS protocol binding (headers, NATS 2.2+):
	// ce-<name> and content-type.
	NATS = Binding{Name: "nats", Prefix: "ce-", ContentTypeKey: "content-type"}
	// AMQP follows the CloudEvents AMQP protocol binding's naming in AMQP
	// 0-9-1 message headers: cloudEvents_<name>, the prefix that binding
	// now prefers (receivers accept cloudEvents: too; the underscore is
	// also a valid JMS property name). datacontenttype is the message's
	// content_type property, as the binding maps it to AMQP's content-type:
	// the amqp backend moves ContentTypeKey there.
	AMQP = Binding{Name: "amqp", Prefix: "cloudEvents_", ContentTypeKey: "content-type"}
	// Redis is Outflow's binding for Redis Streams, which has no official
	// one: fields ce_<name> and content-type of the stream entry, beside
	// watermill-redisstream's own (payload, metadata,
	// _watermill_message_uuid), as Kafka's headers are named. The redis
	// backend lifts these keys out of the metadata into fields.
	Redis = Binding{Name: "redis", Prefix: "ce_", ContentTypeKey: "content-type"}
)

// Key is the metadata key of attribute name in b.
func (b Binding) Key(name string) string {
	if name == "datacontenttype" {
		return b.ContentTypeKey
	}
	return b.Prefix + name
}

// IsKey reports whether k is one of b's keys (a metadata key that starts
// with b's prefix, or its content type key).
func (b Binding) IsKey(k string) bool {
	return k == b.ContentTypeKey || strings.HasPrefix(k, b.Prefix)
}

// Apply returns a copy of msg (same UUID, payload and context) whose
// metadata also holds c's attributes of msg under b's keys. msg itself is
// left as it is: the forwarder and a Tee's other side keep theirs.
func (c Config) Apply(b Binding, msg *message.Message) *message.Message {
	attrs := c.Attributes(msg)
	out := message.NewMessage(msg.UUID, msg.Payload)
	out.Metadata = make(message.Metadata, len(msg.Metadata)+len(attrs))
	for k, v := range msg.Metadata {
		out.Metadata[k] = v
	}
	for _, a := range attrs {
		out.Metadata[b.Key(a.Name)] = a.Value
	}
	out.SetContext(msg.Context())
	return out
}

// AddedBytes is what Apply adds to msg's metadata: the keys and values of
// its attributes, as outbox.Config.MaxEventBytes counts metadata. A key
// msg's metadata already has is counted anyway (the count errs long).
func (c Config) AddedBytes(b Binding, msg *message.Message) int {
	n := 0
	for _, a := range c.Attributes(msg) {
		n += len(b.Key(a.Name)) + len(a.Value)
	}
	return n
}
