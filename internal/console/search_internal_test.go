package console

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// parseSearch reads the window in UTC (a zone only when RFC 3339 gives
// one), resolves a preset against now, and names the field it refuses.
func TestParseSearch(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 30, 15, 500, time.UTC)
	for _, tc := range []struct {
		q             string
		from, to      string // as written back; "" when open
		before, after string
		field         string // of the refusal; "" when accepted
	}{
		{q: "", from: "", to: ""},
		{q: "from=2026-03-01+10:00:05", from: "2026-03-01 10:00:05"},
		{q: "from=2026-03-01T10:00:05", from: "2026-03-01 10:00:05"},
		{q: "from=2026-03-01+10:00", from: "2026-03-01 10:00:00"},
		{q: "from=2026-03-01T10:00", from: "2026-03-01 10:00:00"},
		{q: "from=2026-03-01", from: "2026-03-01 00:00:00"},
		{q: "from=2026-03-01T10:00:05%2B02:00", from: "2026-03-01 08:00:05"}, // RFC 3339 with its zone, to UTC
		{q: "from=2026-03-01T10:00:05Z&to=2026-03-01T11:00:00Z", from: "2026-03-01 10:00:05", to: "2026-03-01 11:00:00"},
		{q: "since=15m", from: "2026-03-01 12:15:15"},
		{q: "since=1h&to=2026-03-02", from: "2026-03-01 11:30:15", to: "2026-03-02 00:00:00"},
		{q: "since=24h", from: "2026-02-28 12:30:15"},
		{q: "before=3.17", before: "3.17"},
		{q: "after=0.17", after: "0.17"},
		{q: "from=noon", field: "from"},
		{q: "from=2026-02-30", field: "from"},
		{q: "to=12:00", field: "to"},
		{q: "from=2026-03-02&to=2026-03-01", field: "from"},
		{q: "from=2026-03-01&to=2026-03-01", field: "from"},
		{q: "since=1d", field: "since"},
		{q: "since=1h&from=2026-03-01", field: "since"},
		{q: "before=17", field: "before"},
		{q: "before=-1.2", field: "before"},
		{q: "after=1.x", field: "after"},
		{q: "after=1.1&before=2.2", field: "after"},
	} {
		v, err := url.ParseQuery(tc.q)
		require.NoError(t, err)
		f, err := parseSearch(v, now)
		if tc.field != "" {
			var se searchError
			require.ErrorAs(t, err, &se, tc.q)
			require.Equal(t, tc.field, se.field, "%s: %v", tc.q, err)
			continue
		}
		require.NoError(t, err, tc.q)
		require.Equal(t, tc.from, f.From, tc.q)
		require.Equal(t, tc.to, f.To, tc.q)
		if tc.before != "" {
			require.Equal(t, tc.before, f.before.String(), tc.q)
		} else {
			require.Nil(t, f.before, tc.q)
		}
		if tc.after != "" {
			require.Equal(t, tc.after, f.after.String(), tc.q)
		} else {
			require.Nil(t, f.after, tc.q)
		}
	}
}

// localPath keeps a path of the console and sends anything else to "/".
func TestLocalPath(t *testing.T) {
	t.Parallel()
	for next, want := range map[string]string{
		"/search?topic=payments": "/search?topic=payments",
		"/journey?q=a#event-3":   "/journey?q=a#event-3",
		"/":                      "/",
		"":                       "/",
		"//evil.example":         "/",
		"/\\evil.example":        "/",
		"https://evil.example/":  "/",
		"/login?next=/x":         "/",
		"/a\x00b":                "/",
		"/caf\u00e9":             "/café",
		"/\u2028//evil.example":  "/",
		"/search?q=%2F%2Fevil":   "/search?q=%2F%2Fevil",
	} {
		require.Equal(t, want, localPath(next), "%q", next)
	}
}

// union sorts, removes duplicates and empties, and bounds the list.
func TestUnion(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"a", "b", "c"}, union([]string{"c", "a", ""}, []string{"b", "a"}))
	many := make([]string, maxChoices+10)
	for i := range many {
		many[i] = string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))
	}
	require.Len(t, union(many, nil), maxChoices)
}
