// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// Parameter and result layouts of per-device programs come from `mhlo.sharding` strings. The
// mesh is synthesized from the device count (8 -> d0=2 x d1=2 x d2=2, row-major over device
// ids); each tiled dim gets the ordered axes whose block index is its tile index on every
// device. Iota tile assignments with transposes, explicit device lists, replicated last tile
// dims; leftover reducer functions and mhlo.copy are what XLA's converter leaves behind.

module attributes {mhlo.num_partitions = 8 : i32} {
  func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }
  func.func private @add.clone(%a: tensor<f32>, %b: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.add %a, %b : tensor<f32>
    return %0 : tensor<f32>
  }
  // x: rows over dp (d0), columns over tp (d1, d2). w: rows over tp; the transposed iota
  // [4,1,2]<=[2,4]T(1,0) lists devices 0,4,1,5,2,6,3,7: tile i on devices {i, i+4}.
  // CHECK-LABEL: func.func @iota_transposed
  // FULL: func.func @iota_transposed{{.*}}entangle.rho = ["result#0 = concat over 'd0' along dim 0"], entangle.verdict = "proven"
  func.func @iota_transposed(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]<=[8]}"}, %w: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"}) attributes {entangle.refines = @ref} {
    // CHECK: stablehlo.dot {{.*}}entangle.relation = "tile [{d0}, {}] partial sum {d1, d2} : dot_general(%arg0, %arg1)"
    %0 = stablehlo.dot %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    // CHECK: mhlo.copy {{.*}}entangle.relation = "tile [{d0}, {}] partial sum {d1, d2} : dot_general(%arg0, %arg1)"
    %1 = mhlo.copy %0 : tensor<4x4xf32>
    %2 = "stablehlo.all_reduce"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %2 : tensor<4x4xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 8 : i32} {
  func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }
  // The same layouts written as explicit device lists and last_tile_dims={replicated}.
  // CHECK-LABEL: func.func @device_lists
  // FULL: func.func @device_lists{{.*}}entangle.verdict = "proven"
  func.func @device_lists(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]0,1,2,3,4,5,6,7}"}, %w: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dims={replicated}}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{devices=[2,1,4]<=[8] last_tile_dims={replicated}}"}) attributes {entangle.refines = @ref} {
    // CHECK: stablehlo.dot {{.*}}entangle.relation = "tile [{d0}, {}] partial sum {d1, d2} : dot_general(%arg0, %arg1)"
    %0 = stablehlo.dot %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %2 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %2 : tensor<4x4xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 8 : i32} {
  func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
    // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }
  // w's row blocks in plain device order: device d holds block d / 2, not the block of its tp
  // coordinate, so the contraction pairs x's columns with the wrong rows of w.
  // CHECK-LABEL: func.func @misordered
  // FULL: func.func @misordered{{.*}}entangle.verdict = "not proven"
  func.func @misordered(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]<=[8]}"}, %w: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"}) attributes {entangle.refines = @ref} {
    // CHECK: stablehlo.dot {{.*}}entangle.relation = "opaque: dot_general: operands are laid out differently along dim 0 (split over ('d1', 'd2') vs split over ('d0', 'd1'))"
    // expected-error @+1 {{dot_general: operands are laid out differently along dim 0}}
    %0 = stablehlo.dot %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %2 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %2 : tensor<4x4xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = stablehlo.tanh %x : tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
  // A maximal sharding (one device holds the value) is not a layout entangle relates: a clean
  // "unsupported" verdict, not a crash.
  // CHECK-LABEL: func.func @maximal
  // FULL: func.func @maximal{{.*}}entangle.verdict = "not proven"
  // expected-error @+1 {{parameter layout unusable: maximal sharding {maximal device=0} (one device holds the value)}}
  func.func @maximal(%x: tensor<4x4xf32> {mhlo.sharding = "{maximal device=0}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.tanh %x : tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = stablehlo.tanh %x : tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
  // A manual result sharding (a shard_map body left in the program): unsupported.
  // CHECK-LABEL: func.func @manual
  // FULL: func.func @manual{{.*}}entangle.verdict = "not proven"
  func.func @manual(%x: tensor<4x4xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{manual}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.tanh %x : tensor<4x4xf32>
    // expected-error @+1 {{result #0 layout unusable: manual sharding {manual}}}
    return %0 : tensor<4x4xf32>
  }
}

// -----

// Every value replicated and no mhlo.num_partitions (what XLA leaves for a function whose
// shardings are all replicated): no op reads the device id or talks to another device, so every
// device runs the same computation and one device is exact.
module {
  func.func @ref(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %0 = stablehlo.exponential %x : tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
  // FULL: func.func @all_replicated{{.*}}entangle.verdict = "proven"
  func.func @all_replicated(%x: tensor<2x4xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<2x4xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    // CHECK: stablehlo.exponential{{.*}}entangle.relation = "replicated : exponential(%arg0)"
    %0 = stablehlo.exponential %x : tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}
