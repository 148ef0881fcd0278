// The circuit breaker. Every phase that calls phalanx serve goes through it (PreFilter's PlanForPod,
// PostFilter, Reserve, Unreserve, Permit and PreBind), so an unreachable service costs the
// scheduling loop at most one deadline per cooldown; Permit also asks it before holding a member
// at the barrier, so a member is never held for a service that cannot release it.

package phalanx

import (
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrOpen is returned without calling when the breaker is open: phalanx serve failed the last
// calls in a row, so the plugin answers at once instead of holding the scheduling loop.
var ErrOpen = errors.New("phalanx serve unreachable (circuit open)")

// Breaker is a consecutive-failure circuit breaker. After Threshold transport failures in a row
// it opens for Cooldown; then one call is let through (half-open): success closes it, failure
// opens it for another Cooldown.
type Breaker struct {
	Threshold int
	Cooldown  time.Duration
	now       func() time.Time

	mu        sync.Mutex
	failures  int
	openUntil time.Time
	trial     bool // a half-open trial call is in flight
}

// NewBreaker returns a closed breaker on the wall clock.
func NewBreaker(threshold int, cooldown time.Duration) *Breaker {
	return &Breaker{Threshold: threshold, Cooldown: cooldown, now: time.Now}
}

// Allow says whether a call may be made now (nil) or ErrOpen.
func (b *Breaker) Allow() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures < b.Threshold {
		return nil
	}
	if b.now().Before(b.openUntil) || b.trial {
		return ErrOpen
	}
	b.trial = true
	return nil
}

// Record counts the outcome of an allowed call; only transport failures count (an answer of the
// service, even a refusal, means it is reachable).
func (b *Breaker) Record(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.trial = false
	if !transportFailure(err) {
		b.failures = 0
		return
	}
	b.failures++
	if b.failures >= b.Threshold {
		b.openUntil = b.now().Add(b.Cooldown)
	}
}

// Open reports whether calls are refused right now.
func (b *Breaker) Open() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures >= b.Threshold && (b.now().Before(b.openUntil) || b.trial)
}

func transportFailure(err error) bool {
	if err == nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted, codes.Unknown:
		return true
	}
	return false
}
