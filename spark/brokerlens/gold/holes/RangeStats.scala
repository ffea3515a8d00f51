package brokerlens.jvm

import java.util.regex.Pattern

import scala.collection.mutable
import scala.collection.mutable.ArrayBuffer

import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.{FunctionIdentifier, InternalRow}
import org.apache.spark.sql.catalyst.expressions.{Expression, ExpressionInfo, GenericInternalRow}
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback
import org.apache.spark.sql.catalyst.util.{ArrayBasedMapData, GenericArrayData, MapData}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/**
 * A cursor snapshot's acknowledged ranges (gold/holes/ranges.py), as the Spark SQL function
 *
 * {{{
 * brokerlens_range_stats(individually_deleted_messages, ledger_entries, cap, 'range pattern')
 * }}}
 *
 * One pass over the string: whether its outline is well formed, then, for a well-formed string
 * with ranges, their count, the ranges empty or out of order, the entries acknowledged and exposed
 * past the cap, the ranges per ledger and what the long-array format keeps and weighs. Each figure
 * is null where the SQL of ranges.py's docstring (its aggregates over the ranges, with their
 * nulls) has it null: a ledger's size unknown, no cap. A number beyond a 64-bit integer (no
 * Pulsar position has one) makes the string malformed.
 */
class RangeStatsExtension extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    val info = new ExpressionInfo(classOf[RangeStats].getName, RangeStats.Name)
    extensions.injectFunction((FunctionIdentifier(RangeStats.Name), info, (args: Seq[Expression]) => RangeStats(args)))
  }
}

case class RangeStats(args: Seq[Expression]) extends Expression with CodegenFallback {
  import RangeStats._

  override def children: Seq[Expression] = args
  override def nullable: Boolean = true
  override def foldable: Boolean = false
  override def dataType: DataType = ResultType
  override protected def withNewChildrenInternal(newChildren: IndexedSeq[Expression]): Expression = copy(args = newChildren)

  @transient private lazy val range: Pattern = args match {
    case Seq(_, _, _, p) if p.foldable && p.dataType == StringType => Pattern.compile(p.eval().toString)
    case _ => throw new IllegalArgumentException(s"$Usage, not $Name(${args.mkString(", ")})")
  }

  override def eval(input: InternalRow): Any = {
    val text = args.head.eval(input)
    if (text == null) return null
    val ledgerEntries = Option(args(1).eval(input).asInstanceOf[MapData]).map(entries)
    val cap = Option(args(2).eval(input)).map(_.asInstanceOf[Number].longValue)
    stats(text.toString, ledgerEntries, cap)
  }

  private final class Range(val pos: Int, val ll: Long, val le: Long, val ul: Long, val ue: Long)

  private final class Ledger(val ul: Long) {
    var firstAcked: Long = Long.MaxValue
    var lastAcked: Long = Long.MinValue
    var n = 0L
    var bad: Option[Long] = None
    var entries: Option[Long] = None
    var entriesUnknown = 0L
    var exposure: Option[Long] = None
    var exposureUnknown: Option[Long] = None
  }

  private def stats(raw: String, ledgerEntries: Option[Map[Long, Option[Long]]], cap: Option[Long]): InternalRow = {
    // ranges.py's parse_ranges: white space deleted, Pulsar 1.x's leader and trailing ", ]" mended.
    val text = TrailingComma.matcher(raw.filterNot(Whitespace.contains(_)).replace("\u2025", "..")).replaceAll("]")
    val ranges = ArrayBuffer.empty[Range]
    val matched = new java.lang.StringBuilder("[")
    val m = range.matcher(text)
    var wellFormed = true
    while (m.find()) {
      if (ranges.nonEmpty) matched.append(',')
      matched.append(m.group())
      try ranges += new Range(ranges.length, m.group(1).toLong, m.group(2).toLong, m.group(3).toLong, m.group(4).toLong)
      catch { case _: NumberFormatException => wellFormed = false }
    }
    val outlineOk = wellFormed && text == matched.append(']').toString
    val row = new GenericInternalRow(ResultType.length)
    row.update(0, outlineOk)
    if (!outlineOk || ranges.isEmpty) return row

    val ledgers = mutable.LinkedHashMap.empty[Long, Ledger]
    var previous: Range = null
    for (r <- ranges) {
      val outOfOrder = r.ll > r.ul || (r.ll == r.ul && r.le >= r.ue)
      // SQL: lag() is null on the first range, so its test is null unless the range itself is bad.
      val bad: Option[Boolean] =
        if (previous == null) (if (outOfOrder) Some(true) else None)
        else Some(outOfOrder || previous.ul > r.ll || (previous.ul == r.ll && previous.ue > r.le))
      val entries = rangeEntries(r, ledgerEntries)
      val beyond = cap.map(r.pos > _)
      val l = ledgers.getOrElseUpdate(r.ul, new Ledger(r.ul))
      l.firstAcked = math.min(l.firstAcked, if (r.ll == r.ul) r.le + 1 else 0L)
      l.lastAcked = math.max(l.lastAcked, r.ue)
      l.n += 1
      l.bad = sum(l.bad, bad.map(b => if (b) 1L else 0L))
      l.entries = sum(l.entries, entries)
      if (entries.isEmpty) l.entriesUnknown += 1
      l.exposure = sum(l.exposure, if (beyond.contains(true)) entries else None)
      // (beyond AND entries IS NULL) as an int: null when beyond is null and the entries unknown.
      val unknown: Option[Long] = beyond match {
        case Some(b) => Some(if (b && entries.isEmpty) 1L else 0L)
        case None => if (entries.isEmpty) None else Some(0L)
      }
      l.exposureUnknown = sum(l.exposureUnknown, unknown)
      previous = r
    }

    // The long-array format walks the ledgers in id order (ranges.py's _long_array).
    var runUnknown = 0L
    var runEntries: Option[Long] = None
    var keptKnown = true
    var keptLedgers, keptBytes, leftEntries = 0L
    var rangesParsed, unknownEntries = 0L
    var badRanges, ackedEntries, exposure, exposureUnknown: Option[Long] = None
    var maxRanges = Long.MinValue
    val perLedgerKeys = new Array[Any](ledgers.size)
    val perLedgerValues = new Array[Any](ledgers.size)
    var i = 0
    for (l <- ledgers.values.toSeq.sortBy(_.ul)) {
      runUnknown += l.entriesUnknown
      runEntries = sum(runEntries, l.entries)
      val kept: Option[Boolean] =
        if (runUnknown != 0) None
        else for (run <- runEntries; own <- l.entries; c <- cap) yield run - own <= c
      val words = Math.floor(l.lastAcked / 64.0).toLong + 1
      val zeroWords = Math.floor(l.firstAcked / 64.0).toLong
      val listMap = 1L + varintBytes(l.ul) + zeroWords * ZeroWordBytes + (words - zeroWords) * WordBytes
      val fieldBytes = 1L + varintBytes(listMap) + listMap
      kept match {
        case Some(true) => keptLedgers += 1; keptBytes += fieldBytes
        case Some(false) => leftEntries += l.entries.getOrElse(0L)
        case None => keptKnown = false
      }
      rangesParsed += l.n
      badRanges = sum(badRanges, l.bad)
      ackedEntries = sum(ackedEntries, l.entries)
      unknownEntries += l.entriesUnknown
      exposure = sum(exposure, l.exposure)
      exposureUnknown = sum(exposureUnknown, l.exposureUnknown)
      maxRanges = math.max(maxRanges, l.n)
      perLedgerKeys(i) = l.ul
      perLedgerValues(i) = l.n
      i += 1
    }
    row.update(1, rangesParsed)
    row.update(2, badRanges.getOrElse(null))
    row.update(3, if (unknownEntries == 0) ackedEntries.getOrElse(null) else null)
    row.update(4, if (exposureUnknown.contains(0L)) exposure.getOrElse(0L) else null)
    row.update(5, ledgers.size)
    row.update(6, maxRanges)
    row.update(7, new ArrayBasedMapData(new GenericArrayData(perLedgerKeys), new GenericArrayData(perLedgerValues)))
    if (keptKnown) {
      row.update(8, keptLedgers)
      row.update(9, keptBytes)
      row.update(10, leftEntries)
    }
    row
  }

  /** Entries in (lower..upper]: within a ledger b - a; across ledgers the rest of the lower one,
   * the ledgers in between and 0..b of the upper one (unknown where a size is). */
  private def rangeEntries(r: Range, ledgerEntries: Option[Map[Long, Option[Long]]]): Option[Long] =
    if (r.ll == r.ul) Some(r.ue - r.le)
    else
      ledgerEntries.flatMap { sizes =>
        val between = sizes.iterator.filter { case (k, _) => k > r.ll && k < r.ul }.foldLeft(Option(0L)) {
          case (acc, (_, v)) => for (a <- acc; x <- v) yield a + x
        }
        for (lower <- sizes.get(r.ll).flatten; b <- between) yield (lower - 1 - r.le) + b + (r.ue + 1)
      }
}

object RangeStats {
  val Name = "brokerlens_range_stats"
  private val Usage = s"$Name(individually_deleted_messages, ledger_entries, cap, 'range pattern')"

  val ResultType: StructType = StructType(Seq(
    StructField("outline_ok", BooleanType),
    StructField("ranges_parsed", LongType),
    StructField("bad_ranges", LongType),
    StructField("acked_entries", LongType),
    StructField("exposure_entries", LongType),
    StructField("ledgers", IntegerType),
    StructField("max_ranges_per_ledger", LongType),
    StructField("ranges_per_ledger", MapType(LongType, LongType)),
    StructField("long_array_ledgers", LongType),
    StructField("long_array_bytes", LongType),
    StructField("long_array_exposure", LongType)))

  // Java's \s: deleted one by one, as ranges.py's translate does.
  private val Whitespace = Set(' ', '\t', '\n', '\u000b', '\f', '\r')
  private val TrailingComma = Pattern.compile(",\\]$")
  // LongListMap's words (ranges.py): a zero word 2 bytes, any other at most 11.
  private val ZeroWordBytes = 2L
  private val WordBytes = 11L

  private def sum(a: Option[Long], b: Option[Long]): Option[Long] = (a, b) match {
    case (Some(x), Some(y)) => Some(x + y)
    case (None, y) => y
    case (x, None) => x
  }

  /** Bytes of a protobuf varint of a non-negative int64 (1 for a negative one, as ranges.py counts). */
  private def varintBytes(x: Long): Long = 1L + (1 to 8).count(k => x >= (1L << (7 * k)))

  private def entries(map: MapData): Map[Long, Option[Long]] = {
    val keys = map.keyArray()
    val values = map.valueArray()
    (0 until map.numElements()).map(i => keys.getLong(i) -> (if (values.isNullAt(i)) None else Some(values.getLong(i)))).toMap
  }
}
