package payouts_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every Go block of docs/getting-started.md is a verbatim excerpt of a file
// of this example (whitespace aside), so the guide compiles and is tested
// with it: edit the code here first, then copy it into the guide.
func TestGuideCodeBlocksAreThisExamplesCode(t *testing.T) {
	guide, err := os.ReadFile("../../docs/getting-started.md")
	if err != nil {
		t.Fatal(err)
	}
	var sources strings.Builder
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		b, err := os.ReadFile(path)
		sources.WriteString(normalize(string(b)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(guide), -1)
	if len(blocks) < 8 {
		t.Fatalf("the guide has %d Go blocks; expected the walk-through's (at least 8)", len(blocks))
	}
	for _, b := range blocks {
		if !strings.Contains(sources.String(), normalize(b[1])) {
			t.Errorf("this block of the guide is not in examples/payouts (edit the code, then copy it):\n%s", b[1])
		}
	}
}

// normalize collapses whitespace, so indentation and wrapping may differ.
func normalize(s string) string { return strings.Join(strings.Fields(s), " ") }
