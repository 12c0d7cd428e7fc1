package replay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFilterValidate(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		f    Filter
		want string // "" when valid
	}{
		{"empty", Filter{}, ErrEmptyFilter.Error()},
		{"all", Filter{All: true}, ""},
		{"all and more", Filter{All: true, Topic: "t"}, "All excludes"},
		{"topic", Filter{Topic: "t"}, ""},
		{"ids without type", Filter{AggregateIDs: []string{"a"}}, "need AggregateType"},
		{"ids", Filter{AggregateType: "p", AggregateIDs: []string{"a"}}, ""},
		{"empty id", Filter{AggregateType: "p", AggregateIDs: []string{""}}, "aggregate id is empty"},
		{"empty type", Filter{EventTypes: []string{""}}, "event type is empty"},
		{"window", Filter{Since: t0, Until: t0.Add(time.Hour)}, ""},
		{"backwards", Filter{Since: t0, Until: t0}, "Since must be before Until"},
		{"since only", Filter{Since: t0}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.f.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestFilterWhere(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		f     Filter
		where string
		args  int
	}{
		{Filter{All: true}, publishedCond, 0},
		{Filter{Topic: "t"}, "o.topic = $3 AND " + publishedCond, 1},
		{Filter{Topic: "t", AggregateType: "p", AggregateIDs: []string{"a"}, EventTypes: []string{"e"}, Since: t0, Until: t0},
			"o.topic = $3 AND o.aggregate_type = $4 AND o.aggregate_id = ANY($5::text[]) AND " +
				"o.event_type = ANY($6::text[]) AND o.occurred_at >= $7 AND o.occurred_at < $8 AND " + publishedCond, 6},
	}
	for _, tt := range tests {
		where, args := tt.f.where(3)
		require.Equal(t, tt.where, where)
		require.Len(t, args, tt.args)
	}
}

func TestResetValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		r    Reset
		want string
	}{
		{Reset{AggregateType: "p", AllAggregates: true}, "Consumer is required"},
		{Reset{Consumer: "c", AllAggregates: true}, "AggregateType is required"},
		{Reset{Consumer: "c", AggregateType: "p"}, "give AggregateIDs or AllAggregates"},
		{Reset{Consumer: "c", AggregateType: "p", AggregateIDs: []string{"a"}, AllAggregates: true}, "not both"},
		{Reset{Consumer: "c", AggregateType: "p", AggregateIDs: []string{""}}, "aggregate id is empty"},
		{Reset{Consumer: "c", AggregateType: "p", AggregateIDs: []string{"a"}}, ""},
		{Reset{Consumer: "c", AggregateType: "p", AllAggregates: true}, ""},
	}
	for _, tt := range tests {
		err := tt.r.Validate()
		if tt.want == "" {
			require.NoError(t, err)
			continue
		}
		require.ErrorContains(t, err, tt.want)
	}
}
