package forwarder

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestTruncateKeepsValidUTF8(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		n    int
		want string
	}{
		{"short", "abc", 5, "abc"},
		{"exact", "abcde", 5, "abcde"},
		{"ascii cut", "abcdef", 5, "abcde"},
		{"cut inside a 2-byte char", "abcdé", 5, "abcd"},
		{"cut after a 2-byte char", "abcé", 5, "abcé"},
		{"cut inside a 3-byte char", "ab€cd", 4, "ab"},
		{"cut inside a 4-byte char", "a😀b", 4, "a"},
		{"cut before a 4-byte char", "a😀b", 1, "a"},
		{"nothing fits", "😀", 3, ""},
		{"invalid bytes replaced", "a\xffb", 10, "a\uFFFDb"},
		{"NUL replaced", "a\x00b", 10, "a\uFFFDb"},
		{"replacement then cut", "ab\xff", 3, "ab"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := truncate(tc.in, tc.n)
			require.Equal(t, tc.want, got)
			require.True(t, utf8.ValidString(got))
			require.LessOrEqual(t, len(got), tc.n)
		})
	}
	long := strings.Repeat("é", 3000)
	got := truncate(long, maxErrorBytes)
	require.True(t, utf8.ValidString(got))
	require.Len(t, got, maxErrorBytes)
}
