package brokerlens.interceptor;

import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;

/**
 * The finished records, oldest first, each with a sequence number (1, 2, ... since the broker
 * started), kept until the buffer is over {@code maxRecords} or {@code maxBytes} (UTF-8 bytes of
 * the JSON lines): then the oldest are dropped and counted in {@link #dropped()}. A fetch does not
 * remove records, so a collector that retries with the same {@code after} gets the same records,
 * and one that passes the last sequence it landed gets no duplicates. Used by the flusher and the
 * HTTP threads only, never on the dispatch path, so a monitor is fine here.
 */
final class RecordBuffer {
    record Rec(long seq, String line, int bytes) {}

    record Page(List<Rec> records, long firstSeq, long lastSeq, long dropped, long missed, long bytes) {}

    private final ArrayDeque<Rec> records = new ArrayDeque<>();
    private final long maxRecords;
    private final long maxBytes;
    private long bytes;
    private long lastSeq;
    private long dropped;

    RecordBuffer(long maxRecords, long maxBytes) {
        this.maxRecords = Math.max(1, maxRecords);
        this.maxBytes = Math.max(1, maxBytes);
    }

    synchronized long nextSeq() {
        return lastSeq + 1;
    }

    /** Appends a line whose text already carries {@code seq} (from {@link #nextSeq()}). */
    synchronized void add(long seq, String line) {
        int size = line.getBytes(StandardCharsets.UTF_8).length + 1;
        records.addLast(new Rec(seq, line, size));
        lastSeq = seq;
        bytes += size;
        while (!records.isEmpty() && (records.size() > maxRecords || bytes > maxBytes)) {
            Rec gone = records.pollFirst();
            bytes -= gone.bytes();
            dropped++;
        }
    }

    synchronized long dropped() {
        return dropped;
    }

    /** The records after sequence {@code after}, at most {@code limit}; {@code missed} says how many
     * records after {@code after} were dropped before this fetch could get them. */
    synchronized Page after(long after, int limit) {
        long firstSeq = records.isEmpty() ? lastSeq + 1 : records.peekFirst().seq();
        long missed = Math.max(0, Math.min(firstSeq - 1, lastSeq) - Math.max(after, 0));
        List<Rec> out = new ArrayList<>();
        long outBytes = 0;
        if (after < lastSeq) {
            // Records are contiguous by seq: skip from the head without looking at the lines.
            long skip = Math.max(0, after - firstSeq + 1);
            Iterator<Rec> it = records.iterator();
            for (long i = 0; i < skip && it.hasNext(); i++) {
                it.next();
            }
            while (it.hasNext() && out.size() < limit) {
                Rec r = it.next();
                out.add(r);
                outBytes += r.bytes();
            }
        }
        return new Page(out, firstSeq, lastSeq, dropped, missed, outBytes);
    }
}
