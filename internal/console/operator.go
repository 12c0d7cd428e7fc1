package console

import (
	"crypto/sha256"
	"crypto/subtle"
	"sync"
	"time"
)

// operatorKeyID and operatorKeyName stand for the operator key in the log
// and on the pages, where an API key's id and name would be.
const (
	operatorKeyID   = "operator-key"
	operatorKeyName = "operator"
)

// memSessions are the sessions of a FrameworkOnly console: no table of the
// database holds them (the framework has none for logins), so they live
// as long as the process.
type memSessions struct {
	mu     sync.Mutex
	byHash map[string]memSession // by the token's SHA-256, as console_sessions keys them
}

type memSession struct {
	expires time.Time
}

func (m *memSessions) open(token string, now time.Time, ttl time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for h, s := range m.byHash { // the expired go, as the login's DELETE does in the table
		if !now.Before(s.expires) {
			delete(m.byHash, h)
		}
	}
	m.byHash[string(tokenHash(token))] = memSession{expires: now.Add(ttl)}
}

func (m *memSessions) live(token string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.byHash[string(tokenHash(token))]
	return ok && now.Before(s.expires)
}

// close ends the session and says whether there was one.
func (m *memSessions) close(token string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := string(tokenHash(token))
	_, ok := m.byHash[h]
	delete(m.byHash, h)
	return ok
}

// operatorKey says whether secret is the operator key, in constant time.
func (c *Console) operatorKey(secret string) bool {
	sum := sha256.Sum256([]byte(secret))
	return secret != "" && subtle.ConstantTimeCompare(sum[:], c.cfg.OperatorKeySHA256) == 1
}
