package brokerlens.jvm;

import java.io.Serializable;
import java.util.ArrayDeque;
import java.util.ArrayList;
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
 * periods.py uses it at scrape grain). Null arithmetic is
 * Spark SQL's: sums skip nulls, least() ignores them, anything else with a null is null.
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
  };

  /**
   * The input's column positions, checked: the scope columns (strings), then those named above.
   * {@code caughtUp} is the cursor state whose records are not charged unless
   * throttle_non_backlog (AbstractBaseDispatcher); {@code cursorSource} the {@code source} of the
   * cursor snapshot rows, which carry their state in {@code _cursor_state}.
   */
  public static Layout layout(StructType in, List<String> scope, String caughtUp, String cursorSource) {
    return new Layout(in, scope, caughtUp, cursorSource);
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
    final UTF8String caughtUp, cursorSource;

    Layout(StructType in, List<String> scopeColumns, String caughtUp, String cursorSource) {
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
   * next row that is not a cursor snapshot gives its {@code _next_t0_us} (cursor snapshots read
   * meanwhile are held behind it, to keep the order); the rows go out when it is known.
   */
  static final class Scan implements Iterator<InternalRow> {
    final Layout l;
    final Iterator<InternalRow> rows;
    final ArrayDeque<InternalRow> ready = new ArrayDeque<>();
    final ArrayList<InternalRow> held = new ArrayList<>();
    Object[] heldOut; // the outputs of held's first row, whose _next_t0_us is not known yet
    InternalRow previous; // the last row read (a copy)
    // The scope's running state.
    UTF8String cursorLast;
    final Long[] delivered = new Long[2]; // running sum of the counted amounts (null: none yet)
    final boolean[] hasFloor = new boolean[2]; // any limited row yet
    final Long[] floorNegSeg = new Long[2], floorV = new Long[2]; // min of (-seg, least(P, S))
    final long[] credit = new long[2]; // after the scope's last limited row
    final Long[] lastDelivery = new Long[2]; // the quota integrated to the stretch's last delivery

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
      if (ready.isEmpty()) release(); // the partition's last rows
      if (ready.isEmpty()) throw new NoSuchElementException();
      return ready.poll();
    }

    void read(InternalRow row) {
      boolean sameScope = previous != null && sameScope(previous, row);
      if (!sameScope) {
        release();
        reset();
      }
      previous = row;
      Object[] out = compute(row);
      InternalRow joined = new JoinedRow(row, new GenericInternalRow(out));
      if (l.cursorSource.equals(row.getUTF8String(l.source))) {
        if (held.isEmpty()) ready.add(joined);
        else held.add(joined);
        return;
      }
      if (heldOut != null) heldOut[7] = row.getLong(l.t0);
      release();
      held.add(joined);
      heldOut = out;
    }

    void release() {
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
