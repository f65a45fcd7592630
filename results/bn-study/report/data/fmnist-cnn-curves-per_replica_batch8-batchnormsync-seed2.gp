set datafile missing '?'
set terminal pngcairo size 1100,600 font 'sans,11' noenhanced
set output 'results/bn-study/report/fmnist-cnn-curves-per_replica_batch8-batchnormsync-seed2.png'
set multiplot layout 1,2 title 'fmnist-cnn (per_replica_batch8-batchnormsync-seed2)'
set grid
set key bottom right
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
plot 'results/bn-study/report/data/fmnist-cnn-curves-per_replica_batch8-batchnormsync-seed2-0.dat' using 1:2 with linespoints lw 2 title '8 replicas'
set key top right
set ylabel 'train loss (log scale)'
set logscale y
plot 'results/bn-study/report/data/fmnist-cnn-curves-per_replica_batch8-batchnormsync-seed2-0.dat' using 1:3 with linespoints lw 2 title '8 replicas'
unset logscale y
unset multiplot
set terminal svg size 1100,600 font 'sans,11' noenhanced
set output 'results/bn-study/report/fmnist-cnn-curves-per_replica_batch8-batchnormsync-seed2.svg'
set multiplot layout 1,2 title 'fmnist-cnn (per_replica_batch8-batchnormsync-seed2)'
set grid
set key bottom right
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
plot 'results/bn-study/report/data/fmnist-cnn-curves-per_replica_batch8-batchnormsync-seed2-0.dat' using 1:2 with linespoints lw 2 title '8 replicas'
set key top right
set ylabel 'train loss (log scale)'
set logscale y
plot 'results/bn-study/report/data/fmnist-cnn-curves-per_replica_batch8-batchnormsync-seed2-0.dat' using 1:3 with linespoints lw 2 title '8 replicas'
unset logscale y
unset multiplot
set output
