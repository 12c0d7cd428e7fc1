package testservers

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// Outage is a server a test can take down and bring back: [RedisServer],
// [NATSServer], [Proxy] and [KafkaCluster] all are.
type Outage interface {
	Stop()
	Start()
}

// Proxy is a TCP proxy in front of a server the test must not stop (the
// shared RabbitMQ or PostgreSQL): Stop cuts every connection through it and
// refuses new ones, as the server's crash would look to its clients; Start
// lets connections through again. Point the client at Addr.
type Proxy struct {
	Addr string
	ln   *cutListener

	mu     sync.Mutex
	target string
}

// StartProxy listens on a free 127.0.0.1 port and forwards every
// connection to target (host:port) until t ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := newCutListener("127.0.0.1:0")
	if err != nil {
		t.Fatalf("outflowtest: proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln}
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		ln.Stop()
		<-done
	})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			to := p.target
			p.mu.Unlock()
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			if !ln.track(s) {
				c.Close()
				s.Close()
				continue
			}
			s = &trackedConn{Conn: s, l: ln}
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	return p
}

// Stop drops every connection and refuses new ones until Start.
func (p *Proxy) Stop() { p.ln.Stop() }

// Start accepts connections again.
func (p *Proxy) Start() { p.ln.Start() }

// Retarget sends the connections made from now on to target, and cuts
// those open: the clients reconnect to target, as they would to a server
// that took over an address (a failover behind a virtual IP or a DNS
// name).
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
	p.ln.Stop()
	p.ln.Start()
}

// cutListener is a listener whose connections can all be cut at once:
// while stopped, a connection is closed as soon as it is accepted (the
// client sees a reset, as from a dead server, and not a hang).
type cutListener struct {
	net.Listener
	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
}

func newCutListener(addr string) (*cutListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &cutListener{Listener: ln, conns: map[net.Conn]struct{}{}}, nil
}

// Accept returns the next connection accepted while the listener is up.
func (l *cutListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.track(c) {
			return &trackedConn{Conn: c, l: l}, nil
		}
		c.Close()
	}
}

// track records c to be cut by Stop; false if the listener is down.
func (l *cutListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *cutListener) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = true
	for c := range l.conns {
		_ = c.Close()
	}
	clear(l.conns)
}

func (l *cutListener) Start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = false
}

type trackedConn struct {
	net.Conn
	l *cutListener
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c.Conn)
	c.l.mu.Unlock()
	err := c.Conn.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil // already cut by Stop
	}
	return err
}
