package brokerlens.interceptor;

import java.util.concurrent.atomic.AtomicLongArray;
import org.apache.pulsar.broker.service.Subscription;

/**
 * One subscription's dispatch counts in a ring of per-second slots, written by the broker's
 * dispatch threads and harvested by the flusher thread once the second has closed.
 *
 * <p>The dispatch path only does atomic adds on one {@link AtomicLongArray} allocated when the
 * subscription is first seen: no lock, no allocation per entry. A slot is claimed for a second by
 * a compare-and-set from {@link #FREE}; the flusher takes the counts with {@code getAndSet(0)} and
 * frees the slot. Counts are never reset by a claim, so an add that lands after its second was
 * harvested (a dispatch thread stalled for longer than the flush grace between reading the clock
 * and adding) is not lost: it is attributed to a later second and counted in {@link #late}.
 */
final class SubscriptionCounters {
    static final int SLOTS = 8; // a power of two: the flusher harvests within ~1.3 s, far inside 8 s
    static final int FIELDS = 5; // second, msgs, bytes, entries, redelivered_msgs
    static final long FREE = -1;

    final Subscription subscription;
    final String topic;
    final String name;
    final boolean persistent;
    private final AtomicLongArray cells = new AtomicLongArray(SLOTS * FIELDS);
    /** The last second with a dispatch; read by the flusher to evict idle subscriptions. */
    volatile long lastActiveSecond;
    /**
     * The highest position dispatched so far (ledger, entry), for dispatchers whose redelivery
     * tracker is disabled (Exclusive/Failover: {@code RedeliveryTrackerDisabled}): an entry at or
     * below it has been dispatched before (the cursor was rewound by a redelivery or a seek).
     */
    volatile long highLedger = -1;
    volatile long highEntry = -1;

    SubscriptionCounters(Subscription subscription, long nowSecond) {
        this.subscription = subscription;
        this.topic = subscription.getTopicName();
        this.name = subscription.getName();
        this.persistent = subscription.getTopic() != null && subscription.getTopic().isPersistent();
        for (int slot = 0; slot < SLOTS; slot++) {
            cells.set(slot * FIELDS, FREE);
        }
        this.lastActiveSecond = nowSecond;
    }

    /** On a dispatch thread: add one entry's counts to {@code second}. Returns false when the slot
     * held another, unharvested second (the flusher is more than {@link #SLOTS} seconds late). */
    boolean add(long second, long msgs, long bytes, long redelivered) {
        int base = (int) (second & (SLOTS - 1)) * FIELDS;
        long held = cells.get(base);
        boolean own = true;
        if (held != second) {
            if (!cells.compareAndSet(base, FREE, second)) {
                own = cells.get(base) == second; // another dispatch thread claimed it for the same second
            }
        }
        cells.getAndAdd(base + 1, msgs);
        cells.getAndAdd(base + 2, bytes);
        cells.getAndAdd(base + 3, 1);
        if (redelivered != 0) {
            cells.getAndAdd(base + 4, redelivered);
        }
        if (lastActiveSecond != second) {
            lastActiveSecond = second;
        }
        return own;
    }

    /** On the flusher: take the counts of a closed {@code second} into {@code out} (msgs, bytes,
     * entries, redelivered); false when nothing was dispatched in it. */
    boolean harvest(long second, long[] out) {
        int base = (int) (second & (SLOTS - 1)) * FIELDS;
        if (cells.get(base) != second) {
            return false;
        }
        for (int f = 0; f < 4; f++) {
            out[f] = cells.getAndSet(base + 1 + f, 0);
        }
        cells.compareAndSet(base, second, FREE);
        return true;
    }

    /** True when no slot holds an unharvested second (safe to forget the subscription). */
    boolean drained() {
        for (int slot = 0; slot < SLOTS; slot++) {
            if (cells.get(slot * FIELDS) != FREE) {
                return false;
            }
        }
        return true;
    }
}
