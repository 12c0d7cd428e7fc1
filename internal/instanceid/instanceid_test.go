package instanceid

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	a, b := New(), New()
	host, _ := os.Hostname()
	if want := fmt.Sprintf("%s-%d-", host, os.Getpid()); !strings.HasPrefix(a, want) || len(a) != len(want)+8 {
		t.Fatalf("New() = %q, want %q and 8 random characters", a, want)
	}
	if a == b {
		t.Fatalf("two calls gave the same id %q", a)
	}
}
