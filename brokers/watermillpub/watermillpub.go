package watermillpub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/configcheck"
)

// Config configures a [Broker].
type Config struct {
	// Publisher is the Watermill publisher. Required. The broker does not
	// close it.
	Publisher message.Publisher
	// Topic names the Watermill topic of a message. Defaults to its
	// Outgoing.Topic.
	Topic func(m forwarder.Outgoing) string
	// Classify returns the error Publish reports for a message whose
	// Publisher call failed with err: wrapping
	// [forwarder.ErrBrokerUnavailable] when the broker, not the message,
	// failed. Defaults to [DefaultClassify].
	Classify func(err error) error
	// MaxMessageBytes, when positive, is the largest message the broker
	// takes, as MessageBytes counts: the broker is then a
	// [forwarder.PayloadLimiter].
	MaxMessageBytes int
	// MessageBytes counts a message against MaxMessageBytes. Defaults to
	// the payload plus every metadata key and value.
	MessageBytes func(m forwarder.Outgoing) int
}

// Broker is a [forwarder.Broker] publishing through a Watermill publisher;
// see the package documentation for what it keeps of the contract.
type Broker struct{ cfg Config }

var _ forwarder.Broker = (*Broker)(nil)

// New returns the broker. It is a [forwarder.PayloadLimiter] when
// cfg.MaxMessageBytes is set (see [Limited]).
func New(cfg Config) (forwarder.Broker, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg}
	if cfg.MaxMessageBytes > 0 {
		return Limited{b}, nil
	}
	return b, nil
}

func (c *Config) setDefaults() {
	if c.Topic == nil {
		c.Topic = func(m forwarder.Outgoing) string { return m.Topic }
	}
	if c.Classify == nil {
		c.Classify = DefaultClassify
	}
	if c.MessageBytes == nil {
		c.MessageBytes = metadataAndPayload
	}
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	errs.Check(c.Publisher != nil, "Publisher", "is required")
	errs.Check(c.MaxMessageBytes >= 0, "MaxMessageBytes", "must not be negative")
	return errs.Err("watermillpub config")
}

// Limited is a [Broker] with a payload limit.
type Limited struct{ *Broker }

var _ forwarder.PayloadLimiter = Limited{}

// MaxMessageBytes is Config.MaxMessageBytes.
func (l Limited) MaxMessageBytes() int { return l.cfg.MaxMessageBytes }

// MessageBytes is Config.MessageBytes of m.
func (l Limited) MessageBytes(m forwarder.Outgoing) int { return l.cfg.MessageBytes(m) }

func metadataAndPayload(m forwarder.Outgoing) int {
	n := len(m.Message.Payload)
	for k, v := range m.Message.Metadata {
		n += len(k) + len(v)
	}
	return n
}

// Publish sends msgs one Publisher call each, in order; see the package
// documentation.
func (b *Broker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	done := make(chan struct{})
	results := make([]error, len(msgs))
	sent := 0 // how many calls returned; read after done or under ctx's abandonment
	go func() {
		defer close(done)
		for i, m := range msgs {
			if ctx.Err() != nil {
				return
			}
			m.Message.SetContext(ctx)
			err := b.cfg.Publisher.Publish(b.cfg.Topic(m), m.Message)
			if err != nil {
				err = b.cfg.Classify(fmt.Errorf("publish %s to %s: %w", m.Message.UUID, b.cfg.Topic(m), err))
			}
			results[i] = err
			sent = i + 1
			if errors.Is(err, forwarder.ErrBrokerUnavailable) {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
		// The call in progress is abandoned: nothing of this batch may be
		// reported published from now on, as the goroutine still writes.
		for i := range errs {
			errs[i] = fmt.Errorf("%w: publish abandoned: %w", forwarder.ErrBrokerUnavailable, ctx.Err())
		}
		return errs
	}
	copy(errs, results[:sent])
	var stop error
	if sent > 0 {
		stop = results[sent-1]
	}
	if stop == nil {
		stop = ctx.Err()
	}
	for i := sent; i < len(msgs); i++ {
		errs[i] = fmt.Errorf("%w: not sent after %w", forwarder.ErrBrokerUnavailable, stop)
	}
	return errs
}

// DefaultClassify reports connection and context errors as the broker's
// (wrapping [forwarder.ErrBrokerUnavailable]) and returns any other error
// as it is: the message's.
func DefaultClassify(err error) error {
	var ne net.Error
	switch {
	case errors.As(err, &ne),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %w", forwarder.ErrBrokerUnavailable, err)
	}
	return err
}
