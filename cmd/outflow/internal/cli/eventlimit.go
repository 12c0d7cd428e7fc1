package cli

import (
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/outflow-dev/outflow/events/outbox"
)

// maxEventBytesEnv sets --max-event-bytes when the flag is not given.
const maxEventBytesEnv = "MAX_EVENT_BYTES"

// minEventBytes is the smallest --max-event-bytes taken: an event's
// envelope alone (ids, type, times, trace context) is a few hundred bytes,
// so a smaller limit refuses every event.
const minEventBytes = 256

// eventLimitFlag is serve's --max-event-bytes: the outbox writer's
// Config.MaxEventBytes for the api role's commands.
type eventLimitFlag struct {
	fs    *pflag.FlagSet
	bytes int
}

func addEventLimitFlag(fs *pflag.FlagSet) *eventLimitFlag {
	f := &eventLimitFlag{fs: fs}
	fs.IntVar(&f.bytes, "max-event-bytes", 0, fmt.Sprintf(
		"largest event (payload and metadata, in bytes) the api role's commands may write: a larger one is refused with 413 and nothing committed (0: the default, %d; negative: no limit; env %s)",
		outbox.DefaultMaxEventBytes, maxEventBytesEnv))
	return f
}

// load resolves the flag against MAX_EVENT_BYTES and validates it, naming
// the source of a bad value.
func (f *eventLimitFlag) load() (int, error) {
	n, src := f.bytes, "--max-event-bytes"
	if v, ok := os.LookupEnv(maxEventBytesEnv); ok && v != "" && !f.fs.Changed("max-event-bytes") {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			return 0, fmt.Errorf("invalid %s: want a whole number of bytes, such as 1048576 (0: the default; negative: no limit), not %q", maxEventBytesEnv, v)
		}
		src = maxEventBytesEnv
	}
	if n > 0 && n < minEventBytes {
		return 0, fmt.Errorf("invalid %s: %d bytes is less than an event's envelope: give at least %d (0: the default, %d; negative: no limit)",
			src, n, minEventBytes, outbox.DefaultMaxEventBytes)
	}
	return n, nil
}
