package brokerlens.jvm

import scala.collection.mutable.ArrayBuffer

import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.{FunctionIdentifier, InternalRow}
import org.apache.spark.sql.catalyst.expressions.{Expression, ExpressionInfo}
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback
import org.apache.spark.sql.catalyst.util.{ArrayData, GenericArrayData}
import org.apache.spark.sql.types._

/**
 * One cursor's growth of unacked ranges (gold/holes/cursor_ranges.py's with_growth), as the Spark
 * SQL function
 *
 * {{{
 * brokerlens_growth_slopes(collect_list(struct(at_us, x, ranges)), window_us)
 * }}}
 *
 * For each distinct `at_us` of the cursor's snapshots: how many have non-null `ranges` in
 * `[at_us - window_us, at_us]`, and `regr_slope(ranges, x)` over them. The same figures, bit for
 * bit, as that aggregate over a range frame of a window ordered by `at_us`: Spark folds a sliding
 * frame anew from its first row whenever the frame changes, and so does this, in time order,
 * with `regr_slope`'s own online updates (`covar_pop`'s and `var_pop`'s) and its `ck / m2`. What
 * it saves is Spark's generic machinery around each step (a row copied into the frame's buffer,
 * the aggregate's buffer updated through projections): a frame of a full day's 6 hours holds up
 * to 360 snapshots, folded for every one of them.
 */
class GrowthSlopesExtension extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    val info = new ExpressionInfo(classOf[GrowthSlopes].getName, GrowthSlopes.Name)
    extensions.injectFunction((FunctionIdentifier(GrowthSlopes.Name), info, (args: Seq[Expression]) => GrowthSlopes(args)))
  }
}

case class GrowthSlopes(args: Seq[Expression]) extends Expression with CodegenFallback {
  import GrowthSlopes._

  override def children: Seq[Expression] = args
  override def nullable: Boolean = true
  override def foldable: Boolean = false
  override def dataType: DataType = ResultType
  override protected def withNewChildrenInternal(newChildren: IndexedSeq[Expression]): Expression = copy(args = newChildren)

  @transient private lazy val windowUs: Long = args match {
    case Seq(_, w) if w.foldable && w.dataType == LongType => w.eval().asInstanceOf[Long]
    case _ => throw new IllegalArgumentException(s"$Usage, not $Name(${args.mkString(", ")})")
  }

  override def eval(input: InternalRow): Any = {
    val points = args.head.eval(input).asInstanceOf[ArrayData]
    if (points == null) return null
    val n = points.numElements()
    val structs = Array.tabulate(n)(i => points.getStruct(i, 3))
    val order = (0 until n).sortBy(i => structs(i).getLong(0)) // stable: ties keep their order
    val at = order.map(i => structs(i).getLong(0)).toArray
    val x = order.map(i => structs(i).getDouble(1)).toArray
    val known = order.map(i => !structs(i).isNullAt(2)).toArray
    val y = order.map(i => if (structs(i).isNullAt(2)) 0.0 else structs(i).getLong(2).toDouble).toArray
    val out = ArrayBuffer.empty[InternalRow]
    var first = 0
    var i = 0
    while (i < n) {
      var last = i // the frame takes in every snapshot at the same instant (a range frame's peers)
      while (last + 1 < n && at(last + 1) == at(i)) last += 1
      while (at(first) < at(i) - windowUs) first += 1
      var count = 0
      // Spark's CovPopulation(x, y) and VariancePop(x) buffers, updated as they update them, for
      // pairs without a null; var_pop's count and mean are covar_pop's n and x mean, step for step.
      // regr_slope(y, x) is ck / m2.
      var cn, xAvg, yAvg, ck, m2 = 0.0
      var j = first
      while (j <= last) {
        if (known(j)) {
          count += 1
          val newN = cn + 1.0
          val dx = x(j) - xAvg
          val dxN = dx / newN
          xAvg = xAvg + dxN
          yAvg = yAvg + (y(j) - yAvg) / newN
          ck = ck + dx * (y(j) - yAvg)
          m2 = m2 + dx * (dx - dxN)
          cn = newN
        }
        j += 1
      }
      out += InternalRow(at(i), count, if (m2 == 0.0) null else ck / m2)
      i = last + 1
    }
    new GenericArrayData(out.toArray[Any])
  }
}

object GrowthSlopes {
  val Name = "brokerlens_growth_slopes"
  private val Usage = s"$Name(array of struct(at_us bigint, x double, ranges bigint), window_us bigint)"

  val ResultType: ArrayType = ArrayType(
    StructType(Seq(
      StructField("at_us", LongType, nullable = false),
      StructField("growth_snapshots", IntegerType, nullable = false),
      StructField("slope", DoubleType))),
    containsNull = false)
}
