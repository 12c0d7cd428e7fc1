package claimcheck

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys of a reference. The outbox keeps them in its metadata
// column, the forwarder and the WAL relay publish them as any other
// metadata: every broker binding carries them as headers.
const (
	// RefKey is the store's id of the body ([Postgres]: the message id).
	RefKey = "outflow_body_ref"
	// SHA256Key is the body's SHA-256, lower-case hex.
	SHA256Key = "outflow_body_sha256"
	// SizeKey is the body's length in bytes, decimal.
	SizeKey = "outflow_body_size"
)

// Placeholder is the payload of an event whose body travels by reference.
// Not an empty object: a consumer that does not resolve references (one
// deployed before them, or in another language) must not decode it as a
// payload whose fields are all zero. A strict decoder refuses it naming
// the field; anyone reading the message sees what happened.
const Placeholder = `{"outflow_body_by_reference":true}`

// Sentinel errors; the errors of this package wrap one of them, or a
// transient failure of the store (which a consumer retries like any
// handler error).
var (
	// ErrBodyGone: the reference names no body (purged with its event's
	// retention, or never committed).
	ErrBodyGone = errors.New("claimcheck: body by reference is gone")
	// ErrBodyTampered: the body found does not match its reference's
	// size or sha256, or the reference itself is malformed.
	ErrBodyTampered = errors.New("claimcheck: body does not match its reference")
	// ErrBodyForbidden: the store refused to give the body to this
	// consumer ([Postgres]: its role is not granted outflow_claim_reader).
	ErrBodyForbidden = errors.New("claimcheck: not allowed to read the body by reference")
	// ErrStoreForbidden: the store refused to keep a body for this
	// writer ([Postgres]: its role may not INSERT into
	// outflow_claim_bodies).
	ErrStoreForbidden = errors.New("claimcheck: not allowed to store the body by reference")
	// ErrRefMismatch: the reference names the body of another message
	// than the one carrying it (a forged or altered message pointing at
	// another event's body). The writer always stores a body under its
	// own message's id.
	ErrRefMismatch = fmt.Errorf("%w: reference names another message's body", ErrBodyTampered)
	// ErrNotMigrated: the store's table does not exist (framework
	// migration 00033 not applied).
	ErrNotMigrated = errors.New("claimcheck: outflow_claim_bodies does not exist: run `outflow migrate up` (framework migration 00033)")
)

// Ref is what an event carries instead of its body.
type Ref struct {
	// ID is the store's id of the body.
	ID string
	// SHA256 is the body's digest.
	SHA256 [sha256.Size]byte
	// Size is the body's length in bytes.
	Size int
}

// NewRef is the reference of body, stored under id.
func NewRef(id string, body []byte) Ref {
	return Ref{ID: id, SHA256: sha256.Sum256(body), Size: len(body)}
}

// SetMetadata writes r into md.
func (r Ref) SetMetadata(md message.Metadata) {
	md.Set(RefKey, r.ID)
	md.Set(SHA256Key, hex.EncodeToString(r.SHA256[:]))
	md.Set(SizeKey, strconv.Itoa(r.Size))
}

// Verify checks body against r: its size, then its digest.
func (r Ref) Verify(body []byte) error {
	if len(body) != r.Size {
		return fmt.Errorf("%w: body %s is %d bytes, its reference says %d", ErrBodyTampered, r.ID, len(body), r.Size)
	}
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], r.SHA256[:]) {
		return fmt.Errorf("%w: body %s has sha256 %x, its reference says %x", ErrBodyTampered, r.ID, sum, r.SHA256)
	}
	return nil
}

// RefFromMetadata reads the reference in md: ok is false when md carries
// none (the body is inline). A reference with a key missing or malformed
// is [ErrBodyTampered].
func RefFromMetadata(md message.Metadata) (ref Ref, ok bool, err error) {
	id, hasID := md[RefKey]
	sum, hasSum := md[SHA256Key]
	size, hasSize := md[SizeKey]
	if !hasID && !hasSum && !hasSize {
		return Ref{}, false, nil
	}
	ref.ID = id
	switch b, err := hex.DecodeString(sum); {
	case id == "":
		return Ref{}, true, fmt.Errorf("%w: %s missing", ErrBodyTampered, RefKey)
	case err != nil || len(b) != sha256.Size:
		return Ref{}, true, fmt.Errorf("%w: %s of body %s: not a hex SHA-256", ErrBodyTampered, SHA256Key, id)
	default:
		copy(ref.SHA256[:], b)
	}
	n, err := strconv.Atoi(size)
	if err != nil || n < 0 {
		return Ref{}, true, fmt.Errorf("%w: %s of body %s: not a size", ErrBodyTampered, SizeKey, id)
	}
	ref.Size = n
	return ref, true, nil
}

// Body is one body to store, under the message id of its event.
type Body struct {
	MessageID string
	Ref       Ref
	Data      []byte
}

// Execer runs a statement in the writer's transaction (or queues it on
// the batch the caller sends in it): the writer adapts its pgx,
// database/sql and batch handles to it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) error
}

// Store keeps bodies by reference.
type Store interface {
	// Put stores bodies as part of the business transaction tx, the
	// outbox rows' own: both commit or neither. A store outside
	// PostgreSQL cannot join tx: it must write before tx commits, and
	// tolerate a body whose event rolled back (never referenced).
	Put(ctx context.Context, tx Execer, bodies []Body) error
	// Get returns the body of ref, unverified ([Resolve] verifies it).
	// Errors wrap [ErrBodyGone], [ErrBodyForbidden], [ErrNotMigrated] or
	// are transient.
	Get(ctx context.Context, ref Ref) ([]byte, error)
}

// Resolve returns msg with its body when it carries a reference: a copy
// of msg (same UUID and context) whose payload is the body fetched from
// s and verified, and whose metadata has no reference keys; msg itself is
// unchanged, so that a consumer's dead letter holds the
// reference, never the body. A message without a reference is returned
// as it is. Errors name the message and the reference, never the body's
// content.
func Resolve(ctx context.Context, s Store, msg *message.Message) (*message.Message, error) {
	ref, ok, err := RefFromMetadata(msg.Metadata)
	if !ok {
		return msg, nil
	}
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", msg.UUID, err)
	}
	if ref.ID != msg.UUID {
		// Checked before any fetch: the digest alone would not catch it,
		// since the forger copies the other event's reference whole.
		return nil, fmt.Errorf("message %s: %w: %s is %q", msg.UUID, ErrRefMismatch, RefKey, ref.ID)
	}
	if s == nil {
		return nil, fmt.Errorf("message %s: body %s by reference: no claimcheck.Store to fetch it from", msg.UUID, ref.ID)
	}
	body, err := s.Get(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", msg.UUID, err)
	}
	if err := ref.Verify(body); err != nil {
		return nil, fmt.Errorf("message %s: %w", msg.UUID, err)
	}
	out := message.NewMessage(msg.UUID, body)
	out.Metadata = make(message.Metadata, len(msg.Metadata))
	for k, v := range msg.Metadata {
		switch k {
		case RefKey, SHA256Key, SizeKey:
		default:
			out.Metadata[k] = v
		}
	}
	out.SetContext(msg.Context())
	return out, nil
}
