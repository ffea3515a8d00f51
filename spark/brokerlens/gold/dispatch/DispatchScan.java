package brokerlens.jvm;

import java.io.Serializable;
import java.time.LocalDate;
import java.time.ZoneId;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Lindley's recursion over each dispatch scope's rows in one pass (gold dispatch_periods, see
 * periods.py). Spark SQL needs three window operators for it (the cursor state, the running
 * delivered sums, the running minimum of the recursion's floor), each buffering a scope's whole day
 * and copying every row; this streams the sorted rows once and keeps a few longs per scope.
 *
 * <p>Input: the columns {@code Layout} names below; output: the input columns followed by
 * {@code _cursor_last} (the latest cursor state at or before the row), {@code counted_msgs},
 * {@code counted_bytes}, {@code _x_in_msgs}, {@code _x_out_msgs}, {@code _x_in_bytes},
 * {@code _x_out_bytes} (the recursion's state before and after the row, null without a limit),
 * {@code _next_t0_us} (the start of the scope's next row that is not a cursor snapshot, null for
 * its last), and {@code _credit_in_msgs}, {@code _credit_out_msgs}, {@code _credit_in_bytes},
 * {@code _credit_out_bytes} (the refill the recursion's floor at 0, a full bucket, dropped that
 * the broker may still hold, at most the limit, before and after the row; null without a limit;
 * periods.py uses it at scrape grain), and {@code starved_empty_periods} (below). Null arithmetic
 * is Spark SQL's: sums skip nulls, least() ignores them, anything else with a null is null.
 *
 * <p>{@code starved_empty_periods}, when the input has {@code _backlogged} (else 0): the rate
 * periods without a record, after a record or the opening debt up to the scope's next such row or
 * midnight, whose allowance the debt keeps at 0 while the scope has backlog. The backlog comes in
 * as zero-length marker rows (source {@code backlogSource}, {@code _backlogged} the state of a
 * cursor snapshot, in force until the scope's next one), which the recursion skips. After a row
 * the debt x drains by the limit each period: the allowance stays 0 for floor(x / limit) periods,
 * or floor(x / limit) - 1 for a bucket (the token bucket, and a counter row, whose x is net of
 * its credit), messages or bytes, whichever lasts longer; a period counts when the latest
 * snapshot at or before its start shows backlog (none yet: not counted). The opening debt's gap
 * is counted on the records that start where it ends, a record's on every record of the scope
 * with the same start.
 */
public final class DispatchScan {
  private DispatchScan() {}

  static final String[][] MEASURES = {
    // delivered amount, limit, quota to the row's start, quota to its end, no-limit stretch
    {"_unit_msgs", "msg_limit", "_q0_msgs", "_q1_msgs", "_seg_msgs"},
    {"bytes", "byte_limit", "_q0_bytes", "_q1_bytes", "_seg_bytes"},
  };
  static final String[] OUTPUTS = {
    "_cursor_last", "counted_msgs", "counted_bytes",
    "_x_in_msgs", "_x_out_msgs", "_x_in_bytes", "_x_out_bytes", "_next_t0_us",
    "_credit_in_msgs", "_credit_out_msgs", "_credit_in_bytes", "_credit_out_bytes",
    "starved_empty_periods",
  };
  static final int NEXT_T0 = 7, STARVED = 12;
  static final long US = 1_000_000L;

  /**
   * The input's column positions, checked: the scope columns (strings), then those named above.
   * {@code caughtUp} is the cursor state whose records are not charged unless
   * throttle_non_backlog (AbstractBaseDispatcher); {@code cursorSource} the {@code source} of the
   * cursor snapshot rows, which carry their state in {@code _cursor_state}; {@code backlogSource}
   * that of the backlog markers (null: no starved empty periods counted); {@code scrapeGrain} the
   * {@code grain} of counter rows and {@code tokenBucket} the {@code limiter_model} judged as a
   * bucket; {@code zone} the session's time zone (midnight, where a day's last gap ends).
   */
  public static Layout layout(
      StructType in, List<String> scope, String caughtUp, String cursorSource, String backlogSource,
      String scrapeGrain, String tokenBucket, String zone) {
    return new Layout(in, scope, caughtUp, cursorSource, backlogSource, scrapeGrain, tokenBucket, zone);
  }

  /**
   * One partition's output: its rows, each scope's in (t0_us, is_record) order (the opening debt
   * and cursor snapshots before the records that start with them), each followed by the columns
   * of {@code OUTPUTS}.
   */
  public static Iterator<InternalRow> scan(Layout layout, Iterator<InternalRow> rows) {
    return new Scan(layout, rows);
  }

  /** Column positions (serialised to the executors). */
  public static final class Layout implements Serializable {
    private static final long serialVersionUID = 1L;
    final int[] scope;
    final int t0, isRecord, source, cursorState, throttleNonBacklog;
    final int[] amount = new int[2], limit = new int[2], q0 = new int[2], q1 = new int[2], seg = new int[2];
    final UTF8String caughtUp, cursorSource, backlogSource, scrapeGrain, tokenBucket;
    // The starved empty periods' inputs (-1: no backlog source or _backlogged column, none counted).
    final int backlogged, intervalSeconds, periodSeconds, grain, limiterModel, day;
    final ZoneId zone;

    Layout(
        StructType in, List<String> scopeColumns, String caughtUp, String cursorSource, String backlogSource,
        String scrapeGrain, String tokenBucket, String zone) {
      scope = new int[scopeColumns.size()];
      for (int i = 0; i < scope.length; i++) scope[i] = field(in, scopeColumns.get(i), DataTypes.StringType);
      t0 = field(in, "t0_us", DataTypes.LongType);
      isRecord = field(in, "is_record", DataTypes.BooleanType);
      source = field(in, "source", DataTypes.StringType);
      cursorState = field(in, "_cursor_state", DataTypes.StringType);
      throttleNonBacklog = field(in, "throttle_non_backlog", DataTypes.BooleanType);
      for (int m = 0; m < 2; m++) {
        amount[m] = field(in, MEASURES[m][0], DataTypes.LongType);
        limit[m] = field(in, MEASURES[m][1], DataTypes.LongType);
        q0[m] = field(in, MEASURES[m][2], DataTypes.LongType);
        q1[m] = field(in, MEASURES[m][3], DataTypes.LongType);
        seg[m] = field(in, MEASURES[m][4], DataTypes.LongType);
      }
      this.caughtUp = UTF8String.fromString(caughtUp);
      this.cursorSource = UTF8String.fromString(cursorSource);
      this.backlogSource = backlogSource == null ? null : UTF8String.fromString(backlogSource);
      this.scrapeGrain = scrapeGrain == null ? null : UTF8String.fromString(scrapeGrain);
      this.tokenBucket = tokenBucket == null ? null : UTF8String.fromString(tokenBucket);
      this.zone = ZoneId.of(zone); // a clear error at planning on an unknown zone
      boolean counted = backlogSource != null && Arrays.asList(in.fieldNames()).contains("_backlogged");
      backlogged = counted ? field(in, "_backlogged", DataTypes.BooleanType) : -1;
      intervalSeconds = counted ? field(in, "interval_seconds", DataTypes.DoubleType) : -1;
      periodSeconds = counted ? field(in, "rate_period_seconds", DataTypes.IntegerType) : -1;
      grain = counted ? field(in, "grain", DataTypes.StringType) : -1;
      limiterModel = counted ? field(in, "limiter_model", DataTypes.StringType) : -1;
      day = counted ? field(in, "day", DataTypes.DateType) : -1;
    }

    static int field(StructType in, String name, DataType type) {
      String[] names = in.fieldNames();
      for (int i = 0; i < names.length; i++) {
        if (names[i].equals(name)) {
          if (type != null && !in.fields()[i].dataType().equals(type)) {
            throw new IllegalArgumentException(
                "DispatchScan: column " + name + " is " + in.fields()[i].dataType().simpleString()
                    + ", expected " + type.simpleString());
          }
          return i;
        }
      }
      throw new IllegalArgumentException("DispatchScan: no column " + name + " in " + in.simpleString());
    }
  }

  /**
   * One partition's rows, scope after scope. A record or opening debt is held until the scope's
   * next row that is not a marker (a cursor snapshot or backlog) gives its {@code _next_t0_us}
   * and ends its gap; the records that start together are held until the last of them has its
   * gap counted. Markers read meanwhile are held behind them, to keep the order.
   */
  static final class Scan implements Iterator<InternalRow> {
    final Layout l;
    final Iterator<InternalRow> rows;
    final ArrayDeque<InternalRow> ready = new ArrayDeque<>();
    final ArrayList<InternalRow> held = new ArrayList<>();
    Object[] heldOut; // the outputs of the last record or opening debt, whose gap is not ended yet
    InternalRow previous; // the last row read (a copy)
    // The scope's running state.
    UTF8String cursorLast;
    final Long[] delivered = new Long[2]; // running sum of the counted amounts (null: none yet)
    final boolean[] hasFloor = new boolean[2]; // any limited row yet
    final Long[] floorNegSeg = new Long[2], floorV = new Long[2]; // min of (-seg, least(P, S))
    final long[] credit = new long[2]; // after the scope's last limited row
    final Long[] lastDelivery = new Long[2]; // the quota integrated to the stretch's last delivery
    // The held row's gap: its start, rate period and most periods at 0 (null: none), midnight.
    Long gapPeriod;
    long gapFrom, gapZero, gapDayEnd;
    int dayEnded = Integer.MIN_VALUE; // the day whose midnight gapDayEnd is
    boolean heldIsRecord;
    Boolean backlog; // the latest backlog marker's state (null: none yet)
    Boolean backlogBefore; // ... when the held row was read
    final ArrayList<long[]> backlogSince = new ArrayList<>(); // (at, 0 or 1): markers read after it
    // The records held that start together (at groupT0), and their starved periods so far.
    final ArrayList<Object[]> group = new ArrayList<>();
    long groupT0, groupStarved;
    // An opening debt's starved periods, for the records starting at carryT0.
    long carryT0, carried;

    Scan(Layout l, Iterator<InternalRow> rows) {
      this.l = l;
      this.rows = rows;
    }

    @Override
    public boolean hasNext() {
      return !ready.isEmpty() || !held.isEmpty() || rows.hasNext();
    }

    @Override
    public InternalRow next() {
      while (ready.isEmpty() && rows.hasNext()) read(rows.next().copy());
      if (ready.isEmpty()) endScope(); // the partition's last rows
      if (ready.isEmpty()) throw new NoSuchElementException();
      return ready.poll();
    }

    void read(InternalRow row) {
      boolean sameScope = previous != null && sameScope(previous, row);
      if (!sameScope) {
        endScope();
        reset();
      }
      previous = row;
      UTF8String source = row.getUTF8String(l.source);
      if (l.backlogged >= 0 && l.backlogSource.equals(source)) {
        // A backlog marker: the recursion skips it.
        backlog = !row.isNullAt(l.backlogged) && row.getBoolean(l.backlogged);
        if (heldOut != null) backlogSince.add(new long[] {row.getLong(l.t0), backlog ? 1 : 0});
        Object[] out = new Object[OUTPUTS.length];
        out[STARVED] = 0L;
        hold(new JoinedRow(row, new GenericInternalRow(out)));
        return;
      }
      Object[] out = compute(row);
      InternalRow joined = new JoinedRow(row, new GenericInternalRow(out));
      if (l.cursorSource.equals(source)) {
        hold(joined);
        return;
      }
      long t0 = row.getLong(l.t0);
      boolean isRecord = row.getBoolean(l.isRecord);
      if (heldOut != null) {
        heldOut[NEXT_T0] = t0;
        long starved = gapStarved(t0);
        if (heldIsRecord) groupStarved += starved;
        else {
          // The opening debt's gap: on the records that start where it ends.
          carried = starved + (carryT0 == t0 ? carried : 0);
          carryT0 = t0;
        }
      }
      if (!(isRecord && !group.isEmpty() && t0 == groupT0)) {
        endGroup();
        if (isRecord) {
          groupT0 = t0;
          groupStarved = carryT0 == t0 ? carried : 0;
          carried = 0;
        }
      }
      if (isRecord) group.add(out);
      held.add(joined);
      heldOut = out;
      heldIsRecord = isRecord;
      if (l.backlogged >= 0) startGap(row, out);
      backlogBefore = backlog;
      backlogSince.clear();
    }

    void hold(InternalRow marker) {
      if (held.isEmpty()) ready.add(marker);
      else held.add(marker);
    }

    /** The held row's gap ends at midnight; its group's count is complete. */
    void endScope() {
      if (heldOut != null && heldIsRecord) groupStarved += gapStarved(gapDayEnd);
      endGroup();
    }

    /** The held records' count is complete: they go out, with the markers behind them. */
    void endGroup() {
      for (Object[] out : group) out[STARVED] = groupStarved;
      group.clear();
      groupStarved = 0;
      ready.addAll(held);
      held.clear();
      heldOut = null;
    }

    boolean sameScope(InternalRow a, InternalRow b) {
      for (int i : l.scope) {
        boolean an = a.isNullAt(i), bn = b.isNullAt(i);
        if (an != bn || (!an && !a.getUTF8String(i).equals(b.getUTF8String(i)))) return false;
      }
      return true;
    }

    void reset() {
      cursorLast = null;
      for (int m = 0; m < 2; m++) {
        delivered[m] = null;
        hasFloor[m] = false;
        floorNegSeg[m] = null;
        floorV[m] = null;
        credit[m] = 0;
        lastDelivery[m] = null;
      }
      backlog = null;
      carried = 0;
    }

    /**
     * The gap after a record or opening debt: it starts at the row's end, its periods are the
     * limit's rate period, and the allowance stays 0 for at most {@code gapZero} of them (the
     * debt after the row over the limit: see the class comment). Spark SQL's arithmetic: a
     * division of longs is a double's, floored.
     */
    void startGap(InternalRow row, Object[] out) {
      long t0 = row.getLong(l.t0);
      gapFrom = t0 + (long) Math.floor(row.getDouble(l.intervalSeconds) * US + 0.5);
      gapPeriod = row.isNullAt(l.periodSeconds) ? null : row.getInt(l.periodSeconds) * US;
      int day = row.getInt(l.day);
      if (day != dayEnded) { // a scope's rows are of one day or two: not a time-zone lookup a row
        gapDayEnd = LocalDate.ofEpochDay(day + 1L).atStartOfDay(l.zone).toEpochSecond() * US;
        dayEnded = day;
      }
      boolean scrape = l.scrapeGrain.equals(row.getUTF8String(l.grain));
      boolean bucket = scrape || (!row.isNullAt(l.limiterModel) && l.tokenBucket.equals(row.getUTF8String(l.limiterModel)));
      long zero = 0;
      for (int m = 0; m < 2; m++) {
        Long xOut = (Long) out[4 + 2 * m];
        if (xOut == null || row.isNullAt(l.limit[m])) continue;
        double limit = row.getLong(l.limit[m]);
        if (limit == 0) continue; // Spark's division by 0 is null
        long periods;
        if (bucket) {
          long creditOut = scrape ? (Long) out[9 + 2 * m] : 0;
          periods = Math.max(0, (long) Math.floor((xOut - creditOut) / limit) - 1);
        } else {
          periods = (long) Math.floor(xOut / limit);
        }
        zero = Math.max(zero, periods);
      }
      gapZero = zero;
    }

    /**
     * The held row's gap ending at {@code end}: its periods at 0 whose start has backlog, the
     * latest marker at or before the start (those read before the row, then those since).
     */
    long gapStarved(long end) {
      if (l.backlogged < 0 || gapPeriod == null || gapPeriod <= 0) return 0;
      long p = gapPeriod, from = gapFrom;
      long n = Math.min((long) Math.floor((double) (end - from) / p), gapZero);
      if (n <= 0) return 0;
      long to = from + n * p;
      long starved = 0;
      Boolean state = backlogBefore;
      long since = Long.MIN_VALUE;
      for (int i = 0; i <= backlogSince.size(); i++) {
        long until = i < backlogSince.size() ? backlogSince.get(i)[0] : Long.MAX_VALUE;
        if (Boolean.TRUE.equals(state) && since < to && until > from) {
          // Period starts from + k * p inside [lo, hi): ceil(hi / p) - ceil(lo / p).
          long lo = Math.max(since, from) - from, hi = Math.min(until, to) - from;
          starved += Math.floorDiv(hi + p - 1, p) - Math.floorDiv(lo + p - 1, p);
        }
        if (i < backlogSince.size()) {
          since = until;
          state = backlogSince.get(i)[1] == 1;
        }
      }
      return starved;
    }

    /** The row's outputs but _next_t0_us, from the scope's state before it; the state after. */
    Object[] compute(InternalRow row) {
      if (!row.isNullAt(l.cursorState)) cursorLast = row.getUTF8String(l.cursorState).clone();
      boolean throttled = !row.isNullAt(l.throttleNonBacklog) && row.getBoolean(l.throttleNonBacklog);
      // Not charged: a record while the cursors were caught up and the broker does not throttle
      // non-backlog consumers (charge_rule "not charged" in periods.py).
      boolean exempt = row.getBoolean(l.isRecord) && !throttled && l.caughtUp.equals(cursorLast);
      Object[] out = new Object[OUTPUTS.length];
      out[0] = cursorLast;
      out[STARVED] = 0L;
      for (int m = 0; m < 2; m++) {
        Long d = exempt ? Long.valueOf(0) : nullable(row, l.amount[m]);
        out[1 + m] = d;
        if (d != null) delivered[m] = delivered[m] == null ? d : delivered[m] + d;
        if (row.isNullAt(l.limit[m])) continue; // no limit: no recursion, x stays null
        Long c = delivered[m];
        Long q0 = nullable(row, l.q0[m]), q1 = nullable(row, l.q1[m]), seg = nullable(row, l.seg[m]);
        // P: the running value just before the row (after the gap drained); S: just after it.
        Long p = minus(minus(c, d), q0), s = minus(c, q1);
        Long negSeg = seg == null ? null : -seg;
        Long sameStretch = hasFloor[m] && negSeg != null && negSeg.equals(floorNegSeg[m]) ? floorV[m] : null;
        Long before = least(sameStretch, seg != null && seg == 0 ? Long.valueOf(0) : null);
        Long floor = least(before, p);
        Long xIn = minus(p, floor), xOut = minus(s, least(floor, s));
        out[3 + 2 * m] = xIn;
        out[4 + 2 * m] = xOut;
        // What the floor at 0 dropped, in the gap before the row and in the row: the bucket's
        // refill while full. The broker adds its refill only at its own (a period after the
        // last), so it may still hold up to the limit of it. But a period or more without a
        // delivery (a quota's worth since the last) ends with the broker's refill at the read
        // that ends the wait, capped: then its bucket holds no more than the limit, tokens
        // plus credit. (The day's first stretch waits from midnight; a later one starts full
        // at its first row.)
        long limit = row.getLong(l.limit[m]);
        long gap = before == null || p == null ? 0 : Math.max(0, before - p);
        long inRow = floor == null || s == null ? 0 : Math.max(0, floor - s);
        if (sameStretch == null) {
          credit[m] = 0;
          lastDelivery[m] = before != null ? Long.valueOf(0) : q0;
        }
        Long since = lastDelivery[m];
        long creditIn = Math.min(limit, credit[m] + gap);
        if (waited(since, q0, limit) && xIn != null) creditIn = Math.min(creditIn, xIn);
        credit[m] = Math.min(limit, creditIn + inRow);
        if (d != null && d > 0) lastDelivery[m] = q1;
        else if (waited(since, q1, limit) && xOut != null) credit[m] = Math.min(credit[m], xOut);
        out[8 + 2 * m] = creditIn;
        out[9 + 2 * m] = credit[m];
        Long v = least(p, s);
        if (!hasFloor[m] || compare(negSeg, floorNegSeg[m]) < 0
            || (compare(negSeg, floorNegSeg[m]) == 0 && compare(v, floorV[m]) < 0)) {
          hasFloor[m] = true;
          floorNegSeg[m] = negSeg;
          floorV[m] = v;
        }
      }
      return out;
    }

    /** A period or more of quota (the limit) from {@code since} to {@code at}. */
    static boolean waited(Long since, Long at, long limit) {
      return since != null && at != null && at - since >= limit;
    }

    static Long nullable(InternalRow row, int i) {
      return row.isNullAt(i) ? null : row.getLong(i);
    }

    static Long minus(Long a, Long b) {
      return a == null || b == null ? null : a - b;
    }

    static Long least(Long a, Long b) {
      if (a == null || b == null) return a == null ? b : a; // (a ternary with min() would unbox)
      return Math.min(a, b);
    }

    /** Spark's ascending order within a struct: null first. */
    static int compare(Long a, Long b) {
      return a == null ? (b == null ? 0 : -1) : b == null ? 1 : Long.compare(a, b);
    }
  }
}
