// Package instanceid names a running instance of a forwarder or consumer
// worker when its Config leaves InstanceID empty.
package instanceid

import (
	"fmt"
	"os"

	"github.com/google/uuid"
)

// New returns host-pid-random: the host and pid say where to look, the
// random suffix keeps two instances started in one process (tests, a
// restart within a container reusing pid 1) apart.
func New() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
}
