"""Field ids and enum values of MNN's FlatBuffers model format, as far as the reader uses them.

Source: MNN's public schema (schema/default/MNN.fbs, CaffeOp.fbs, TensorflowOp.fbs, Tensor.fbs,
Type.fbs, UserDefine.fbs) and the seed ../shared/seeds/mnn_flatbuffer_layout_zh.md, which walks
one file by hand (Net.tensorName is vtable slot 18 = field 7, Net.oplists slot 10 = field 3,
Op.main slot 8 = field 2, Convolution2D.bias slot 8 = field 2). A field's id is its position in
the table's declaration; a union field takes two ids (its type byte, then the table). MNN only
appends fields and enum values, so older files read with these ids. [V] checked against the
MNN 3.6.1 converter's own JSON dump of the files tests/compiler/test_mnn_import.py makes.
"""

from __future__ import annotations

# ---- tables: field name -> field id -------------------------------------------------------

NET = {"oplists": 3, "outputName": 4, "tensorName": 7, "subgraphs": 10}
OP = {"inputIndexes": 0, "main_type": 1, "main": 2, "name": 3, "outputIndexes": 4, "type": 5}
BLOB = {"dims": 0, "dataFormat": 1, "dataType": 2, "uint8s": 3, "int8s": 4, "int32s": 5, "int64s": 6,
        "float32s": 7, "strings": 8, "external": 9}
INPUT = {"dims": 0, "dtype": 1, "dformat": 2}
CONV2D = {"common": 0, "weight": 1, "bias": 2, "quanParameter": 3, "symmetricQuan": 4, "sparseParameter": 5}
CONV2D_COMMON = {"padX": 0, "padY": 1, "kernelX": 2, "kernelY": 3, "strideX": 4, "strideY": 5, "dilateX": 6,
                 "dilateY": 7, "padMode": 8, "group": 9, "outputCount": 10, "inputCount": 11, "relu": 12,
                 "relu6": 13, "pads": 14, "outPads": 15, "hasOutputShape": 16}
POOL = {"padX": 0, "padY": 1, "isGlobal": 2, "kernelX": 3, "kernelY": 4, "strideX": 5, "strideY": 6, "type": 7,
        "padType": 8, "dataType": 9, "ceilModel": 10, "pads": 11, "countType": 12}
POOL3D = {"strides": 0, "kernels": 1, "pads": 2, "type": 3, "padType": 4, "isGlobal": 5}
INNER_PRODUCT = {"outputCount": 0, "biasTerm": 1, "weightSize": 2, "weight": 3, "bias": 4, "axis": 5,
                 "transpose": 6, "quanParameter": 7}
MATMUL = {"T": 0, "transposeA": 1, "transposeB": 2, "weight": 3, "bias": 4}
BATCH_MATMUL = {"adjX": 0, "adjY": 1}
RELU = {"slope": 0}
RELU6 = {"minValue": 0, "maxValue": 1}
PRELU = {"slopeCount": 0, "slope": 1}
ELU = {"alpha": 0}
AXIS = {"axis": 0}
ELTWISE = {"type": 0, "coeff": 1}
BINARY = {"opType": 0, "T": 1, "activationType": 2}
UNARY = {"opType": 0, "T": 1}
FLATTEN = {"axis": 0, "endAxis": 1}
PERMUTE = {"dims": 0}
RESHAPE = {"dims": 0, "dimType": 1}
SCALE = {"channels": 0, "scaleData": 1, "biasData": 2}
SQUEEZE = {"squeezeDims": 0}
EXPAND_DIMS = {"T": 0, "Tdim": 1, "axis": 2}
CAST = {"srcT": 0, "dstT": 1}
GATHER = {"Tindices": 0, "Tparams": 1, "validateIndices": 2, "axis": 3}
REDUCTION = {"operation": 0, "dim": 1, "coeff": 2, "keepDims": 3, "dType": 4}
CONVERT = {"source": 0, "dest": 1}
SLICE = {"axis": 0, "slicePoints": 1, "sourceType": 2}
STRIDED_SLICE = {"beginMask": 2, "endMask": 3, "ellipsisMask": 4, "newAxisMask": 5, "shrinkAxisMask": 6,
                 "fromType": 7}
INTERP = {"widthScale": 0, "heightScale": 1, "outputWidth": 2, "outputHeight": 3, "resizeType": 4,
          "alignCorners": 5, "halfPixelCenters": 6, "widthOffset": 7, "heightOffset": 8, "cubicCoeffA": 9, "ctm": 10}

# ---- enums ----------------------------------------------------------------------------------

#: OpType values 0..135 in declaration order (MNN.fbs), then the explicitly numbered ones.
_OP_TYPES_IN_ORDER = (
    "AbsVal QuantizedAdd ArgMax AsString InstanceNorm BatchToSpaceND Bias BinaryOp Bnll Cast Concat Const "
    "Convolution ConvolutionDepthwise Crop CropAndResize Cubic Deconvolution DeconvolutionDepthwise Dequantize "
    "DetectionOutput Dropout Eltwise ELU Unique Exp ExpandDims Fill Flatten FloorMod Gather GatherV2 Im2Seq "
    "InnerProduct Input Interp Log LRN LSTM MatMul MVN NonMaxSuppression NonMaxSuppressionV2 Normalize Pack "
    "Padding Permute Pooling Power PReLU PriorBox Proposal QuantizedAvgPool QuantizedBiasAdd QuantizedConcat "
    "QuantizedDepthwiseConv2D QuantizedLogistic QuantizedMatMul QuantizedMaxPool QuantizedRelu QuantizedRelu6 "
    "QuantizedReshape QuantizedSoftmax QuantizeMaxMin QuantizeV2 Range Rank ReduceJoin Reduction ReLU ReLU6 "
    "RequantizationRange Requantize Reshape Resize RNN ROIPooling Scale Selu Seq2Out Shape Sigmoid Size Slice "
    "SliceTf Softmax SpaceToBatchND SpatialProduct Split Segment Squeeze StridedSlice StringJoin StringSplit "
    "StringToNumber TanH TfQuantizedConv2D Threshold Tile TopKV2 Transpose UnaryOp Unpack Where Moments "
    "RNNSequenceGRU BatchMatMul Unsqueeze CosineSimilarity DepthToSpace SpaceToDepth ReverseSequence Pooling3D "
    "Convolution3D MatrixBandPart GatherND DetectionPostProcess UnravelIndex ScatterNd OneHot BroadcastTo "
    "Dilation2D").split()
OP_TYPES: dict[int, str] = dict(enumerate(_OP_TYPES_IN_ORDER))
OP_TYPES.update({128: "Raster", 129: "ConvertTensor", 130: "ArgMin", 131: "LinSpace", 132: "RandomUniform",
                 256: "Plugin", 257: "Select", 512: "Extra", 513: "ConvInt8", 514: "Int8ToFloat",
                 515: "DepthwiseConvInt8", 516: "PoolInt8", 517: "FloatToInt8", 518: "EltwiseInt8",
                 600: "While", 601: "If", 603: "LayerNorm", 604: "GridSample"})

#: OpParameter union members (0 is NONE), declaration order in MNN.fbs.
_PARAMS_IN_ORDER = (
    "NONE QuantizedAdd ArgMax AsString Axis BatchNorm BinaryOp Blob CastParam Convolution2D Crop CropAndResize "
    "Dequantize DetectionOutput Eltwise ExpandDims Fill Flatten Gather GatherV2 InnerProduct Input Interp LRN "
    "LSTM MatMul NonMaxSuppressionV2 Normalize PackParam Permute Plugin Pool PRelu PriorBox Proposal "
    "QuantizedAvgPool QuantizedBiasAdd QuantizedConcat QuantizedLogistic QuantizedMatMul QuantizedMaxPool "
    "QuantizedRelu QuantizedRelu6 QuantizedReshape QuantizedSoftmax QuantizeMaxMin QuantizeV2 Range Rank "
    "ReduceJoin ReductionParam Relu Relu6 RequantizationRange Requantize Reshape Resize RoiPooling Scale Selu "
    "Size Slice SliceTf SpaceBatch SqueezeParam StridedSliceParam TensorConvertInfo TfQuantizedConv2D TopKV2 "
    "Transpose UnaryOp MomentsParam RNNParam BatchMatMulParam QuantizedFloatParam DepthSpaceParam EltwiseInt8 "
    "ReverseSequenceParam Extra Pool3D Convolution3D ELU DetectionPostProcessParam OneHotParam PadParam").split()
PARAMS: dict[str, int] = {name: value for value, name in enumerate(_PARAMS_IN_ORDER)}

#: MNN_DATA_FORMAT (Tensor.fbs)
NCHW, NHWC, NC4HW4, NHWC4 = 0, 1, 2, 3
FORMAT_NAMES = {0: "NCHW", 1: "NHWC", 2: "NC4HW4", 3: "NHWC4", 4: "UNKNOWN"}

#: DataType (Type.fbs) values the reader maps; other types are refused
DT_FLOAT, DT_INT32, DT_UINT8, DT_INT8, DT_INT64, DT_BOOL = 1, 3, 4, 6, 9, 10
FLOAT_TYPES = {DT_FLOAT}
INT_TYPES = {DT_INT32, DT_UINT8, DT_INT8, DT_INT64, DT_BOOL}

#: PadMode / PoolPadType (CaffeOp.fbs): CAFFE = explicit pads
PAD_CAFFE, PAD_VALID, PAD_SAME = 0, 1, 2
#: PoolType, AvgPoolCountType
MAXPOOL, AVEPOOL = 0, 1
COUNT_DEFAULT, COUNT_INCLUDE_PADDING, COUNT_EXCLUDE_PADDING = 0, 1, 2

#: EltwiseType -> ONNX op
ELTWISE_OPS = {0: "Mul", 1: "Add", 2: "Max", 3: "Sub"}
#: BinaryOpOperation -> ONNX op (REALDIV on floats is Div; MAX_TEMP/MIN_TEMP are Max/Min)
BINARY_OPS = {0: "Add", 1: "Sub", 2: "Mul", 3: "Div", 4: "Max", 5: "Min", 6: "Pow", 7: "Div", 8: "Min", 9: "Max",
              10: "Greater", 11: "GreaterOrEqual", 12: "Less", 15: "Equal", 16: "LessOrEqual"}
#: UnaryOpOperation -> ONNX op(s) applied in order; SILU is x * sigmoid(x) (written out below)
UNARY_OPS = {0: ("Abs",), 1: ("Neg",), 2: ("Floor",), 3: ("Ceil",), 5: ("Sqrt",), 6: ("Sqrt", "Reciprocal"),
             7: ("Exp",), 8: ("Log",), 15: ("Reciprocal",), 22: ("Sign",), 23: ("Round",), 25: ("Erf",),
             29: ("Sigmoid",), 30: ("Tanh",), 31: ("HardSwish",)}
UNARY_SQUARE, UNARY_SILU = 4, 34
#: Interp resizeType -> ONNX Resize mode; CoordinateTransformationMode -> ONNX's name
RESIZE_MODES = {1: "nearest", 2: "linear", 3: "cubic"}
CTM_NAMES = {1: "align_corners", 2: "half_pixel", 3: "pytorch_half_pixel", 4: "asymmetric", 5: "tf_half_pixel_for_nn"}
#: ReductionType -> ONNX op
REDUCTIONS = {0: "ReduceSum", 3: "ReduceMean", 4: "ReduceMax", 5: "ReduceMin", 6: "ReduceProd"}
