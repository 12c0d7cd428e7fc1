package layering_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// lockKeyRe finds an advisory lock's class: every job of the tree that
// runs on one instance at a time takes pg_advisory(_xact)_lock(class,
// hashtext(current_schema())), each with a class of its own ("ou" and two
// letters, in hexadecimal).
var lockKeyRe = regexp.MustCompile(`(\w+)(?:\s+\w+)?\s*=\s*(0x6f75[0-9a-fA-F]{4})\b`)

// lockKeysFile is the one list of the classes.
var lockKeysFile = filepath.Join("internal", "advisory", "keys.go")

// No two jobs share an advisory lock's class: two that did would keep
// each other from running in the same schema (the WAL mode's audit and the
// webhook gauges' exporter, which holds its lock for as long as it
// exports, did). And every class is in the one list: a key written
// elsewhere is one nobody sees when choosing the next.
func TestAdvisoryLockClassesAreDistinct(t *testing.T) {
	root := filepath.Join("..", "..")
	seen := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lockKeyRe.FindAllStringSubmatch(string(src), -1) {
			where := path + ": " + m[1]
			if rel, _ := filepath.Rel(root, path); rel != lockKeysFile {
				t.Errorf("advisory lock class %s (%s) is outside %s, the one list of them", m[2], where, lockKeysFile)
			}
			if other, ok := seen[strings.ToLower(m[2])]; ok {
				t.Errorf("advisory lock class %s is %s and %s", m[2], other, where)
			}
			seen[strings.ToLower(m[2])] = where
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 9 {
		t.Fatalf("found %d advisory lock classes, expected the tree's 9 or more (the bodies purge's 0x6f757462 included): %v", len(seen), seen)
	}
}
