package outflowtest

import (
	"bytes"
	"sync"
)

// LogBuffer is a log destination that goroutines under test write to
// while the test reads it (a bytes.Buffer is not safe for that): hand it
// to slog.NewTextHandler, then WaitFor a line in String.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
