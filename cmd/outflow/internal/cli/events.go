package cli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/schemacheck"
)

// defaultEventSchemaSnapshot is the reference app's committed snapshot,
// from the repository's root.
var defaultEventSchemaSnapshot = filepath.Join("app", "paymentevents", paymentevents.SchemaSnapshot)

func newEventsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "events",
		Short: "The reference app's event types: check their schemas against the committed snapshot",
	}
	cmd.AddCommand(newEventsCheckCmd())
	return cmd
}

func newEventsCheckCmd() *cobra.Command {
	var (
		snapshot string
		mode     string
		update   bool
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Fail on a change of the app's event types that breaks readers of stored events",
		Long: `Compares the reference app's registered event types (their schema versions and the JSON
shapes of their Go types) with the committed snapshot of every version ever written, and exits
non-zero listing each violation: the event type, the version, the field and the rule.

  --mode backward  this build reads every stored event, of every recorded version (default)
  --mode forward   consumers still on the snapshot's build read what this build writes
  --mode full      both

An out-of-date snapshot (a compatible change not recorded yet) also exits non-zero. --update
records the snapshot (the current versions; older ones stay as they were) and accepts the
breaks it lists: the explicit step a break needs. The rules are in docs/events.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := schemacheck.ParseMode(mode)
			if err != nil {
				return fmt.Errorf("invalid --mode: %w", err)
			}
			if snapshot == "" {
				return errors.New("--snapshot: empty: give the snapshot file's path")
			}
			reg := events.NewRegistry()
			if err := paymentevents.Register(reg); err != nil {
				return fmt.Errorf("payment events: %w", err)
			}
			return checkEventSchemas(cmd, reg, snapshot, m, update)
		},
	}
	cmd.Flags().StringVar(&snapshot, "snapshot", defaultEventSchemaSnapshot, "the committed event schema snapshot (JSON; the default is from the repository's root)")
	cmd.Flags().StringVar(&mode, "mode", string(schemacheck.Backward), "compatibility mode: backward, forward or full")
	cmd.Flags().BoolVar(&update, "update", false, "record the snapshot, accepting the breaks listed")
	return cmd
}

func checkEventSchemas(cmd *cobra.Command, reg *events.Registry, path string, m schemacheck.Mode, update bool) error {
	out := cmd.OutOrStdout()
	old, err := schemacheck.Load(path)
	missing := errors.Is(err, schemacheck.ErrNoSnapshot)
	if err != nil && !missing {
		return fmt.Errorf("--snapshot: %w", err)
	}
	if missing && !update {
		return fmt.Errorf("--snapshot: %w: record it with --update, and commit it", err)
	}
	var violations []schemacheck.Violation
	if !missing {
		if violations, err = schemacheck.Compare(old, reg, schemacheck.Options{Mode: m}); err != nil {
			return err
		}
	}
	next, err := schemacheck.Update(old, reg)
	if err != nil {
		return err
	}
	want, err := next.Marshal()
	if err != nil {
		return err
	}
	have, _ := os.ReadFile(path)
	upToDate := !missing && bytes.Equal(have, want)
	for _, v := range violations {
		fmt.Fprintln(out, v)
	}
	if update {
		if !upToDate {
			if err := next.Write(path); err != nil {
				return fmt.Errorf("--snapshot: %w", err)
			}
			fmt.Fprintf(out, "wrote %s: review its diff and commit it\n", path)
		}
		if len(violations) > 0 {
			fmt.Fprintf(out, "--update accepted the %d break(s) above (%s mode): their readers are yours to handle\n", len(violations), m)
		}
		return nil
	}
	switch {
	case len(violations) > 0:
		return fmt.Errorf("%d change(s) of the event types break readers (%s mode, snapshot %s), listed above: "+
			"make the change a new schema version with an upcaster (docs/events.md), or accept the breaks explicitly with --update and commit the snapshot",
			len(violations), m, path)
	case !upToDate:
		return fmt.Errorf("the snapshot %s is out of date: the change is compatible (%s mode); record it with --update and commit it", path, m)
	}
	fmt.Fprintf(out, "%d event types compatible with %s (%s mode)\n", len(reg.Types()), path, m)
	return nil
}
